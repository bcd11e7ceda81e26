"""scripts/install.sh and the Makefile with a venv already in place.

A venv of another Python than the chosen one, or whose interpreter is gone,
is recreated when install.sh made it (its .vllm-uma-created file says so)
and otherwise left as it is, the install stopped with one line naming what
it found, what it wanted and the fix. Integration tests: they run bash and
make, on stub interpreters (shell scripts that answer install.sh's questions
the way a Python of that version would, and stop it at the torch step), so
no network and no real venv: about a second.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install.sh"
MARK = ".vllm-uma-created"

# What install.sh asks of an interpreter: its version (python_version), to
# make a venv (-m venv DIR: a copy of itself as DIR/bin/python); anything
# else is the torch step, where the stub stops the install.
STUB = """#!/bin/sh
case "$1" in
  -c) echo {version} ;;
  -m) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  *) echo "stub python: stops at $*" >&2; exit 3 ;;
esac
"""


def stub(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STUB.format(version=version))
    path.chmod(0o755)
    return path


@pytest.fixture
def stubs(tmp_path) -> Path:
    """A bin folder of Python 3.11 and 3.12 stubs, first on the PATH install.sh sees."""
    folder = tmp_path / "stubs"
    stub(folder / "python3.11", "3.11")
    stub(folder / "python3.12", "3.12")
    return folder


def venv_of(venv: Path, interpreter: str, *, ours: bool) -> Path:
    """A venv whose bin/python is Python ``interpreter`` ("3.X"), or "gone": a link to
    nothing, as when its Python is removed; with something of the user's in it."""
    if interpreter == "gone":
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(venv.parent / "removed" / "python3.12")
    else:
        stub(venv / "bin" / "python", interpreter)
    if ours:
        (venv / MARK).write_text(f"Python {interpreter} (/usr/bin/python{interpreter})\n")
    (venv / "kept.txt").write_text("something of the user's\n")
    return venv


def install(venv: Path, stubs: Path, python: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "PYTHON": python}
    return subprocess.run(
        ["bash", INSTALL, venv], env=env, capture_output=True, text=True, timeout=60
    )


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def remade(done: subprocess.CompletedProcess) -> bool:
    return "install: creating" in done.stdout or "it is recreated" in done.stdout


def stopped_at_the_torch_step(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 1 and "stub python: stops at" in done.stderr


def test_another_pythons_venv_it_did_not_make_is_left_and_named(tmp_path, stubs):
    venv = venv_of(tmp_path / "venv", "3.12", ours=False)
    wanted = stubs / "python3.11"
    done = install(venv, stubs, python=str(wanted))
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_line(done.stderr)
    assert line.startswith(f"install: {venv} holds Python 3.12, not Python 3.11 ({wanted}), ")
    assert "install.sh did not make it, so it is left as it is." in line
    assert f"Remove it (rm -rf {venv}) to have it recreated with Python 3.11" in line
    assert line.endswith(", or unset PYTHON to keep using it."), line
    assert (venv / "kept.txt").exists()


def test_a_venv_whose_python_is_gone_it_did_not_make_is_left_and_named(tmp_path, stubs):
    venv = venv_of(tmp_path / "venv", "gone", ours=False)
    done = install(venv, stubs)
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_line(done.stderr)
    gone = tmp_path / "removed" / "python3.12"
    assert f"{venv} holds an interpreter that no longer runs ({venv}/bin/python -> {gone})" in line
    assert f"not Python 3.11 ({stubs}/python3.11)" in line
    assert line.endswith(f"Remove it (rm -rf {venv}) to have it recreated with Python 3.11."), line
    assert (venv / "kept.txt").exists()


@pytest.mark.parametrize("interpreter", ["3.12", "gone"])
def test_a_venv_it_made_is_recreated_with_the_chosen_python(tmp_path, stubs, interpreter):
    venv = venv_of(tmp_path / "venv", interpreter, ours=True)
    wanted = stubs / "python3.11"
    done = install(venv, stubs, python=str(wanted))
    assert stopped_at_the_torch_step(done), done.stdout + done.stderr
    assert f"install.sh made it (Python {interpreter} (/usr/bin/python{interpreter})), " in (
        done.stdout
    )
    assert f"so it is recreated with {wanted}\n" in done.stdout
    assert f"install: creating {venv} with {wanted}\n" in done.stdout
    assert not (venv / "kept.txt").exists()
    assert (venv / MARK).read_text() == f"Python 3.11 ({wanted})\n"


def test_without_python_a_venv_of_a_supported_python_is_kept(tmp_path, stubs):
    """A venv made with PYTHON=python3.12 survives the next plain make."""
    venv = venv_of(tmp_path / "venv", "3.12", ours=True)
    done = install(venv, stubs)
    assert stopped_at_the_torch_step(done), done.stdout + done.stderr
    assert f"install: using {venv}'s Python 3.12 (set PYTHON to" in done.stdout
    assert not remade(done), done.stdout
    assert (venv / "kept.txt").exists()


def test_a_venv_of_the_python_asked_for_is_used_as_it_is(tmp_path, stubs):
    venv = venv_of(tmp_path / "venv", "3.12", ours=False)
    done = install(venv, stubs, python=str(stubs / "python3.12"))
    assert stopped_at_the_torch_step(done), done.stdout + done.stderr
    assert not remade(done), done.stdout
    assert (venv / "kept.txt").exists()


def test_an_empty_folder_becomes_the_venv(tmp_path, stubs):
    venv = tmp_path / "venv"
    venv.mkdir()
    done = install(venv, stubs)
    assert stopped_at_the_torch_step(done), done.stdout + done.stderr
    assert f"install: creating {venv} with {stubs}/python3.11\n" in done.stdout
    assert (venv / MARK).exists()


@pytest.mark.parametrize(
    ("interpreter", "python", "reinstalls"),
    [
        ("3.11", "", False),
        ("3.11", "python3.11", False),
        ("3.11", "python3.12", True),  # PYTHON names another version: install.sh decides
        ("gone", "", True),  # the stamp is fresh, the venv does not run
    ],
)
def test_make_runs_install_sh_again_for_another_python_or_a_broken_venv(
    tmp_path, stubs, interpreter, python, reinstalls
):
    venv = venv_of(tmp_path / "venv", interpreter, ours=True)
    (venv / ".vllm-uma-installed").touch()  # newer than every file it depends on
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    env.pop("PYTHON", None)
    make = ["make", "-n", "-C", ROOT, f"VENV={venv}", f"PYTHON={python}", "install"]
    done = subprocess.run(make, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert ("bash scripts/install.sh" in done.stdout) is reinstalls, done.stdout
