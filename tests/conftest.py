"""Shared test set-up.

End-to-end tests (marked ``slow``) need the default model; ``make test``
prepares it before pytest starts, and the fixture below prepares it when a
test is run on its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from vllm_uma import models

    return models.prepare()


@pytest.fixture(scope="session")
def vllm_uma_exe() -> str:
    exe = VENV_BIN / "vllm-uma"
    assert exe.exists(), f"{exe} missing: run `make install` first"
    return str(exe)


@pytest.fixture(autouse=True)
def _no_user_hf_offline_surprises(monkeypatch):
    # Tests never reach a model hub (none is reachable here anyway).
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))


@pytest.fixture(scope="session")
def gemma_model_dir() -> Path:
    """Gemma 3 270M (a sliding-window model), built by its recipe; ``make
    test`` prepares it before pytest starts."""
    from vllm_uma import models

    return models.prepare("gemma-3-270m")
