"""Why pip did not install torch from an index or a wheel folder, read from its ``--log``.

pip's console says "No matching distribution found" whether the index was
unreachable or had no wheel for this Python; its debug log (``--log FILE``,
written at DEBUG level whatever the console's verbosity) tells them apart:

    Could not fetch URL https://HOST/whl/cpu/torch/: connection error: ... - skipping
    WARNING: Location 'file:///DIR/torch/' is ignored: it is neither a file nor a directory.
    Skipping link: none of the wheel's tags (cp39-cp39-manylinux_2_28_x86_64) are compatible
        ...: URL

Stdlib only: it runs in a fresh venv before anything is installed in it.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
from dataclasses import dataclass


class Failure(enum.Enum):
    UNREACHABLE = "unreachable"  # the index's page for torch could not be read
    NO_WHEEL_FITS = "no wheel fits"  # the version is there, for other Pythons/platforms only
    NO_SUCH_VERSION = "no such version"  # read, but it lists no wheel of the version
    OTHER = "other"  # anything else: the log says


@dataclass(frozen=True)
class Diagnosis:
    failure: Failure
    detail: str  # the reason (unreachable), or the wheels' tags (no wheel fits)


_FETCH = re.compile(r"Could not fetch URL (\S+?): (.*) - skipping")
_IGNORED = re.compile(r"Location '(\S+?)' is ignored: (.*)")
_SKIPPED = re.compile(r"Skipping link: (.*?): (\S+\.whl)")
# What urllib3's exception text says underneath, e.g. "[Errno -2] Name or
# service not known", "Connection refused", "Read timed out", "404 Client Error".
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")
_HTTP = re.compile(r"\b(\d{3} (?:Client|Server) Error[^:]*)")


def short_reason(text: str) -> str:
    for pattern in (_ERRNO, _HTTP):
        match = pattern.search(text)
        if match:
            return match.group(1).strip()
    if "timed out" in text.lower():
        return "timed out"
    return text.strip()[:120]


def wheel_tag(url: str) -> str:
    """``cp311-cp311-manylinux_2_28_x86_64`` from a wheel's URL."""
    name = urllib.parse.unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
    parts = name[: -len(".whl")].split("-")
    return "-".join(parts[-3:])


def wheel_version(url: str) -> str:
    name = urllib.parse.unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
    return name.split("-")[1]


def found_none(output: str) -> bool:
    """pip found no distribution for the requirement (with a constraint on torch in
    pip's configuration it says ResolutionImpossible instead)."""
    return "No matching distribution found" in output or "ResolutionImpossible" in output


def skipped_tags(log: str, version: str) -> str:
    """The tags of the wheels of ``version`` pip saw and skipped as not for this Python/machine."""
    tags = set()
    for line in log.splitlines():
        skipped = _SKIPPED.search(line)
        if skipped and wheel_version(skipped.group(2)) == version:
            tags.add(wheel_tag(skipped.group(2)))
    return ", ".join(sorted(tags))


def diagnose(log: str, location: str, version: str) -> Diagnosis:
    """Why pip found no torch ``version`` at ``location`` (an index URL or a folder)."""
    prefix = location.rstrip("/")
    for line in log.splitlines():
        fetch = _FETCH.search(line)
        if fetch and fetch.group(1).startswith(prefix):
            return Diagnosis(Failure.UNREACHABLE, short_reason(fetch.group(2)))
        ignored = _IGNORED.search(line)
        if ignored and ignored.group(1).startswith(prefix):
            return Diagnosis(Failure.UNREACHABLE, ignored.group(2).rstrip("."))
    tags = skipped_tags(log, version)
    if tags:
        return Diagnosis(Failure.NO_WHEEL_FITS, tags)
    if found_none(log):
        return Diagnosis(Failure.NO_SUCH_VERSION, "")
    return Diagnosis(Failure.OTHER, "")


def pythons_of(tags: str, machine: str) -> list[str]:
    """The Pythons ``tags`` have a wheel for on ``machine``: "cp311-cp311-..._x86_64" -> 3.11."""
    found = set()
    for tag in tags.split(", "):
        match = re.match(r"cp3(\d+)-[^-]+-(\S+)$", tag)
        if match and match.group(2).endswith(machine):
            found.add(int(match.group(1)))
    return [f"3.{minor}" for minor in sorted(found)]
