"""tests/unit/conftest.py refuses a process started by a unit test, before
it starts, naming the test and the way out."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest


def test_a_subprocess_is_refused_before_it_starts(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(AssertionError, match="starts a process") as refused:
        subprocess.run(["touch", str(marker)])
    assert not marker.exists()
    message = str(refused.value)
    assert "test_a_subprocess_is_refused_before_it_starts starts a process" in message
    assert "Move the test to tests/integration/" in message


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_is_refused_whatever_its_start_method(method):
    with pytest.raises(AssertionError, match="starts a process"):
        multiprocessing.get_context(method).Process(target=print).start()


def test_a_fork_and_a_shell_are_refused():
    with pytest.raises(AssertionError, match=r"starts a process \(os\.fork\)"):
        os.fork()
    with pytest.raises(AssertionError, match=r"starts a process \(os\.system\)"):
        os.system("true")


def test_a_process_a_module_starts_while_it_is_imported_is_let_through(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    (tmp_path / "starts_at_import.py").write_text(
        f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}], check=True)\n"
    )
    monkeypatch.syspath_prepend(tmp_path)
    import starts_at_import  # noqa: F401

    assert marker.exists()
