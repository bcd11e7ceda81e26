"""scripts/torch_pip_log.py: why pip found no torch, read from its --log.

The log lines are pip 23.2's own, from runs against a closed port on
loopback, a file:// index of other Pythons' wheels, a folder that does not
exist and an HTTP index without torch (timestamps kept, object addresses
shortened); the DNS failure's is the same line with its errno.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    """A module of scripts/ (not a package), registered first as dataclasses require."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


log = _load("torch_pip_log")

VERSION = "2.13.0+cpu"
NO_MATCH = (
    "2026-12-06T08:46:30,878 ERROR: Could not find a version that satisfies the requirement "
    "torch==2.13.0+cpu (from versions: none)\n"
    "2026-12-06T08:46:30,879 ERROR: No matching distribution found for torch==2.13.0+cpu\n"
)


def fetch_failed(url: str, errno: str) -> str:
    return (
        f"2026-12-06T08:46:30,875 Could not fetch URL {url}/torch/: connection error: "
        f"HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
        f"/simple/torch/ (Caused by NewConnectionError('<pip._vendor.urllib3.connection."
        f"HTTPConnection object at 0x7f24>: Failed to establish a new connection: "
        f"{errno}')) - skipping\n"
        f"2026-12-06T08:46:30,876 Skipping link: not a file: {url}/torch/\n"
    )


def skipped(index: str, wheel: str) -> str:
    tag = "-".join(wheel[: -len(".whl")].split("-")[-3:])
    return (
        f"2026-12-06T08:46:36,271   Skipping link: none of the wheel's tags ({tag}) are "
        "compatible (run pip debug --verbose to show compatible tags): "
        f"{index}/{wheel} (from {index}/torch/index.html)\n"
    )


OTHER_PYTHONS = (
    skipped("file:///w/idx", "torch-2.13.0%2Bcpu-cp312-cp312-manylinux_2_28_x86_64.whl")
    + skipped("file:///w/idx", "torch-2.13.0%2Bcpu-cp313-cp313-manylinux_2_28_x86_64.whl")
    + skipped("file:///w/idx", "torch-2.12.0%2Bcpu-cp39-cp39-manylinux_2_28_x86_64.whl")
)


@pytest.mark.parametrize(
    ("errno", "reason"),
    [
        ("[Errno 111] Connection refused", "Connection refused"),
        ("[Errno -2] Name or service not known", "Name or service not known"),
    ],
)
def test_an_index_that_cannot_be_reached_is_told_with_the_reason(errno, reason):
    index = "http://127.0.0.1:9/simple"
    found = log.diagnose(fetch_failed(index, errno) + NO_MATCH, index + "/", VERSION)
    assert found == log.Diagnosis(log.Failure.UNREACHABLE, reason)


def test_an_index_without_a_torch_page_is_unreachable_with_the_http_error():
    index = "http://127.0.0.1:44105/simple"
    text = (
        f"2026-12-06T08:46:43,588 Could not fetch URL {index}/torch/: 404 Client Error: "
        f"File not found for url: {index}/torch/ - skipping\n" + NO_MATCH
    )
    assert log.diagnose(text, index, VERSION) == log.Diagnosis(
        log.Failure.UNREACHABLE, "404 Client Error"
    )


@pytest.mark.parametrize(
    ("location", "line", "reason"),
    [
        (
            "file:///w/noidx",
            "WARNING: Location 'file:///w/noidx/torch/' is ignored: "
            "it is neither a file nor a directory.",
            "it is neither a file nor a directory",
        ),
        (
            "/w/nowhere",
            "WARNING: Location '/w/nowhere' is ignored: "
            "it is either a non-existing path or lacks a specific scheme.",
            "it is either a non-existing path or lacks a specific scheme",
        ),
    ],
)
def test_a_folder_that_is_not_there_is_unreachable(location, line, reason):
    text = f"2026-12-06T08:46:42,245 {line}\n" + NO_MATCH
    assert log.diagnose(text, location, VERSION) == log.Diagnosis(log.Failure.UNREACHABLE, reason)


def test_a_failure_at_another_location_is_not_the_sources():
    """pip's configuration may name other indexes and folders; only the source's own
    failures count."""
    text = (
        fetch_failed("http://127.0.0.1:9/simple", "[Errno 111] Connection refused")
        + "2026-12-06T08:46:42,245 WARNING: Location 'file:///w/pypi/simple/torch/' is "
        "ignored: it is neither a file nor a directory.\n" + NO_MATCH
    )
    found = log.diagnose(text, "https://download.pytorch.org/whl/cpu", VERSION)
    assert found == log.Diagnosis(log.Failure.NO_SUCH_VERSION, "")


def test_wheels_of_the_version_for_other_pythons_only_are_named_by_their_tags():
    found = log.diagnose(OTHER_PYTHONS + NO_MATCH, "file:///w/idx", VERSION)
    # 2.12.0's cp39 wheel is another version: not named.
    assert found == log.Diagnosis(
        log.Failure.NO_WHEEL_FITS,
        "cp312-cp312-manylinux_2_28_x86_64, cp313-cp313-manylinux_2_28_x86_64",
    )


def test_an_index_read_without_the_version_has_no_such_version():
    assert log.diagnose(NO_MATCH, "file:///w/idx", VERSION).failure is log.Failure.NO_SUCH_VERSION
    only_older = OTHER_PYTHONS.split("\n", 2)[2] + NO_MATCH  # the cp39 2.12.0 line
    assert log.diagnose(only_older, "file:///w/idx", VERSION).failure is (
        log.Failure.NO_SUCH_VERSION
    )


def test_any_other_failure_is_other():
    text = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left\n"
    assert log.diagnose(text, "file:///w/idx", VERSION) == log.Diagnosis(log.Failure.OTHER, "")


def test_found_none_is_either_of_pips_two_answers():
    assert log.found_none(NO_MATCH)
    assert log.found_none("ERROR: ResolutionImpossible: for help visit https://pip.pypa.io")
    assert not log.found_none("ERROR: Could not install packages due to an OSError")


def test_skipped_tags_are_those_of_the_version_asked_for():
    assert log.skipped_tags(OTHER_PYTHONS, "2.12.0+cpu") == "cp39-cp39-manylinux_2_28_x86_64"
    assert log.skipped_tags(OTHER_PYTHONS, "2.11.0+cpu") == ""


def test_a_wheels_tag_and_version_come_from_its_quoted_url():
    url = (
        "https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-"
        "manylinux_2_28_x86_64.whl#sha256=0123abcd"
    )
    assert log.wheel_tag(url) == "cp311-cp311-manylinux_2_28_x86_64"
    assert log.wheel_version(url) == "2.13.0+cpu"


UNKNOWN = "something pip never said before " + "x" * 200


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("new connection: [Errno 111] Connection refused')", "Connection refused"),
        ("503 Server Error: Service Unavailable for url: https://h/torch/", "503 Server Error"),
        ("HTTPSConnectionPool(host='h', port=443): Read timed out. (read timeout=15)", "timed out"),
        (f"  {UNKNOWN}\n", UNKNOWN[:120]),
    ],
)
def test_short_reason_is_what_failed_underneath(text, reason):
    assert log.short_reason(text) == reason


def test_pythons_of_tags_are_this_machines_in_version_order():
    tags = (
        "cp313-cp313-manylinux_2_28_x86_64, cp39-cp39-manylinux_2_28_x86_64, "
        "cp311-cp311-manylinux_2_28_aarch64, cp312-cp312-win_amd64, py3-none-any"
    )
    assert log.pythons_of(tags, "x86_64") == ["3.9", "3.13"]
    assert log.pythons_of(tags, "aarch64") == ["3.11"]
    assert log.pythons_of("", "x86_64") == []
