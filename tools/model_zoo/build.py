"""Build a model zoo checkpoint: an architecture's configuration, weights from a fixed seed.

A build is a Hugging Face directory (config.json, model.safetensors,
SmolLM2's tokenizer) that vLLM and transformers both load. The weights are
transformers' own initialisation of the architecture under
``torch.manual_seed(SEED)``: meaningless text, but the compute and the KV
bytes of the real model, and greedy tokens that are a pure function of the
build, so float32 exactness (transformers == a cold vLLM prefill == an L1
hit == a pool restore == a disk restore) holds as a test.

Why a tool, not ``vllm-uma prepare-model``: a user serves a model for its
answers, and these have none. prepare-model's recipes are real weights
(vllm_uma/models/); the zoo is for tests and benchmarks (docs/models.md).

Where: ``<cache>/models/zoo/<name>`` (the cache root of vllm_uma.models,
``$VLLM_UMA_CACHE_DIR`` first). A build is made in a private temp
directory beside it and renamed into place, so a crash leaves no
half-build where a server looks; ``zoo.json`` records what it was built
from, and a build whose record differs (another configuration, seed,
dtype or builder version) is built again.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tools.model_zoo.families import FAMILIES, Family, build_name, parse_build_name
from vllm_uma import models

SEED = 20261204
# transformers' initialisation draws weights from N(0, initializer_range).
# At the publishers' 0.02 a random model's greedy text is one token repeated
# or nearly (measured on the scaled builds: Qwen3 and Llama 1 distinct token
# of 16, Qwen3-MoE 2, Phi-3 6), which would let a restore that changed KV
# bytes still give "the same tokens"; at 0.3 all sixteen greedy tokens
# differ in each and the narrowest top-two margin is 0.009 logits or more,
# far above float32's differences between kernels.
INIT_STD = 0.3
BUILDER_VERSION = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
RECORD = "zoo.json"


def zoo_root() -> Path:
    return models.default_cache_root() / "models" / "zoo"


def record_for(family: Family, size: str, dtype: str) -> dict:
    return dict(
        builder=BUILDER_VERSION,
        family=family.name,
        size=size,
        published=family.real_name,
        seed=SEED,
        init_std=INIT_STD,
        dtype=dtype,
        config=family.config(size),
        weights="synthetic: transformers' initialisation, N(0, init_std), torch.manual_seed(seed)",
    )


def is_built(path: Path, record: dict) -> bool:
    try:
        return json.loads((path / RECORD).read_text()) == record
    except (OSError, ValueError):
        return False


def build(name: str, dtype: str = "float32", root: Path | None = None) -> Path:
    """The directory of build ``name`` (``zoo-qwen3-scaled``...), made if
    missing or stale. ``dtype``: of the saved weights."""
    family, size = parse_build_name(name)
    root = root or zoo_root()
    path = root / (name if dtype == "float32" else f"{name}-{dtype}")
    record = record_for(family, size, dtype)
    if is_built(path, record):
        return path
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".partial-{path.name}-", dir=root))
    try:
        _write(partial, family, size, dtype, record)
        if path.exists():
            shutil.rmtree(path)  # stale: another record
        os.rename(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return path


def _write(out: Path, family: Family, size: str, dtype: str, record: dict) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer_dir = models.prepare(None)  # the default model: SmolLM2's tokenizer
    config = AutoConfig.for_model(**family.config(size), initializer_range=INIT_STD)
    config.architectures = [_architecture(family)]
    tokenizer_config = json.loads((tokenizer_dir / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in tokenizer_config:
            setattr(config, key, tokenizer_config[key])
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(getattr(torch, dtype)).eval()
    model.save_pretrained(out, safe_serialization=True)
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, out / file)
    (out / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))


def _architecture(family: Family) -> str:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    AutoConfig.for_model(family.model_type)  # an unknown type fails here, by name
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family.model_type]


def all_builds(size: str) -> list[str]:
    return [build_name(f, size) for f in FAMILIES.values()]
