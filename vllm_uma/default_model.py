"""The default model under the module name it had before recipes.

The default model is now one recipe among others (vllm_uma/models/,
smollm2.py). This module keeps the names tools and tests were written
against (``prepare()``, ``model_dir(cache_root)``, the check prompt, ...)
so they run unchanged; new code imports ``vllm_uma.models``.
"""

from __future__ import annotations

from pathlib import Path

from vllm_uma import models
from vllm_uma.models import DEFAULT_MODEL_NAME, PrepareError, default_cache_root
from vllm_uma.models.smollm2 import CHECK_ANSWER, CHECK_EXPECTED, CHECK_PROMPT, RECIPE_VERSION

__all__ = [
    "CHECK_ANSWER",
    "CHECK_EXPECTED",
    "CHECK_PROMPT",
    "DEFAULT_MODEL_NAME",
    "RECIPE_VERSION",
    "PrepareError",
    "default_cache_root",
    "model_dir",
    "prepare",
]


def model_dir(cache_root: Path) -> Path:
    return models.model_dir(None, cache_root)


def prepare(cache_root: Path | None = None) -> Path:
    """Build the default model if needed and return its directory."""
    return models.prepare(None, cache_root)
