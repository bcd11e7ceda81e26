"""The project's own venv passes its check, run as scripts/install.sh runs
it: ``python -m vllm_uma.commands.venv_check`` in a process of its own.
The checks themselves: tests/unit/test_venv.py."""

from __future__ import annotations

import subprocess
import sys

from vllm_uma.commands import venv_check


def test_this_venv_passes_the_check():
    assert venv_check.problems() == []
    result = subprocess.run(
        [sys.executable, "-m", "vllm_uma.commands.venv_check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
