"""scripts/choose_python.sh's range of Python versions is pyproject.toml's
requires-python. Its functions, run in bash on stub interpreters:
tests/integration/test_choose_python.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "scripts" / "choose_python.sh"


def _range() -> tuple[int, int]:
    text = LIBRARY.read_text()
    low = int(re.search(r"^MIN_MINOR=(\d+)$", text, re.M).group(1))
    high = int(re.search(r"^MAX_MINOR=(\d+)$", text, re.M).group(1))
    return low, high


def test_the_range_is_pyprojects_requires_python():
    low, high = _range()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">=3.{low},<3.{high + 1}"
