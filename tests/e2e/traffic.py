"""Prompts, requests and /metrics reading shared by the offloading e2e tests."""

from __future__ import annotations

import requests

from vllm_uma.plugin.precision import has_bf16_arithmetic

MODEL = "SmolLM2-135M-Instruct"
# Test servers start eager (about 20 s instead of 70-80 s compiled): the
# outputs they are judged on come from oracles that hold in either mode, and
# tests/e2e/test_serve.py serves the compiled default too.
EAGER = ["--enforce-eager"]
# The geometry the offloading tests count in: nine full blocks per prompt,
# L1, pool and disk sizes in 128-token blocks. vllm-uma serves 32-token
# blocks by default (vllm_uma/plugin/block_size.py), so these tests pin
# vLLM CPU's own 128; tests/e2e/test_block_size.py and the servers that
# count no blocks run the default.
BLOCKS_OF_128 = ["--block-size", "128"]
# The precision the offloading tests serve: the one `--dtype auto` serves on
# this CPU (vllm_uma/plugin/precision.py), named so that the tests' byte
# sizes follow it. bfloat16 where the CPU computes in it (AVX512_BF16, AMX);
# float32 elsewhere, where a bf16 matmul widens in software and costs 8x a
# float32 one: in bf16 these modules alone kept an AVX2 machine's suite at
# 38 minutes. Their judge holds in both: a restore must give the tokens of
# an L1 hit of the same prompt (same prefix split, same KV bytes), which is
# exact in any precision (vllm_uma/models/oracles.py).
SERVED_DTYPE = "bfloat16" if has_bf16_arithmetic() else "float32"
DTYPE = ["--dtype", SERVED_DTYPE]
# KV bytes per element against bf16's 2: the tests' L1, pool and block
# sizes are written for bf16 and scaled by this.
KV_SCALE = 1 if SERVED_DTYPE == "bfloat16" else 2


# bfloat16 on every CPU, for the servers whose point is bf16 serving itself
# (tests/e2e/test_serve.py: its kernel paths, judged by its own oracles).
BF16 = ["--dtype", "bfloat16"]


def kv_bytes(bf16_bytes: int) -> int:
    """A KV size written for bf16 (an L1, a pool, a block), in the served precision."""
    return bf16_bytes * KV_SCALE


def kv_gib(bf16_gib: float) -> str:
    """A --kv-offloading-size written for bf16, in the served precision."""
    return f"{bf16_gib * KV_SCALE:g}"


WORDS = ["apple", "river", "stone", "cloud", "green", "light", "table", "music"]
# (prompt, what computes its prefix): 0 and 1 twice in a row (the second is
# an L1 hit), then four others push them out of a small L1, then they come
# back (restored from a lower tier).
EVICT_AND_REVISIT = [
    (0, "cold"),
    (0, "hit"),
    (1, "cold"),
    (1, "hit"),
    (2, "cold"),
    (3, "cold"),
    (4, "cold"),
    (5, "cold"),
    (0, "revisit"),
    (1, "revisit"),
]


def prompt(i: int, topic: str = "Story") -> str:
    """About 1,200 tokens (9 full KV blocks of 128 tokens), distinct per i and topic."""
    return f"{topic} {i}: " + " ".join(WORDS[(i + k) % 8] + str(k % 10) for k in range(600))


def complete(
    server, i: int, topic: str = "Story", max_tokens: int = 16, model: str = MODEL
) -> list[int]:
    reply = server.complete(model, prompt(i, topic), max_tokens, return_token_ids=True)
    return reply["choices"][0]["token_ids"]


def metrics(server) -> str:
    return requests.get(f"{server.url}/metrics", timeout=10).text
