"""A model's KV bytes, from its config.json, never a constant: per token, and
per block of one KV cache group (a host-pool row, a disk block file's KV).

A block's tokens are the servers' block size, which a benchmark reads from
the flags it starts them with (servers.block_tokens: ``--block-size`` or
vllm-uma's default, vllm_uma/plugin/block_size.py), never a constant of its
own: the same model has 4x smaller rows at 32 tokens than at 128.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


def model_config(model_dir: Path | None = None) -> dict:
    """The model's config.json (the default model's when ``model_dir`` is None)."""
    if model_dir is None:
        from vllm_uma import models

        model_dir = models.prepare()
    return json.loads((Path(model_dir) / "config.json").read_text())


def model_layers(model_dir: Path | None = None) -> int:
    return model_config(model_dir)["num_hidden_layers"]


def kv_bytes_per_token(model_dir: Path | None = None, dtype: str = "bfloat16") -> int:
    """K and V of every layer for one token, from the model's config.json
    (the default model when ``model_dir`` is None): what a running server
    prints as per_block_bytes / block size in its breakdown line."""
    return kv_bytes_per_token_of(model_config(model_dir), DTYPE_BYTES[dtype])


def kv_bytes_per_token_of(config: dict, dtype_bytes: int) -> int:
    """The same from a config.json's fields (the model zoo's, before a build)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def kv_row_bytes(
    model_dir: Path | None = None, dtype: str = "bfloat16", *, block_tokens: int
) -> int:
    """Bytes of one host-pool row (one disk block file's KV): one block of
    ``block_tokens`` tokens of one KV cache group. vLLM puts every layer in
    one group when all layers are alike; when they mix kinds (Gemma 3: 5
    sliding-window layers to 1 full), it makes groups of as many layers as
    the rarest kind has, one group per kind and repeat, and a block is one
    group's layers."""
    config = model_config(model_dir)
    layers = config["num_hidden_layers"]
    kinds = config.get("layer_types") or []
    per_group = layers
    if len(set(kinds)) > 1:
        per_group = min(kinds.count(kind) for kind in set(kinds))
    return block_tokens * kv_bytes_per_token(model_dir, dtype) // layers * per_group


def add_block_size_argument(parser: argparse.ArgumentParser) -> None:
    """``--block-size`` of the tools that size rows without a server: vllm-uma's
    default block (plugin/block_size.py), or another (128, vLLM CPU's) to compare."""
    from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_TOKENS,
        help="tokens per KV block: vllm-uma's default, or 128 (vLLM CPU's) to compare",
    )
