"""Prompts, requests and /metrics reading shared by the offloading e2e tests."""

from __future__ import annotations

import requests

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
# The tests judged against a bf16 oracle serve bf16 on every CPU: --dtype
# auto is float32 on a CPU without bf16 arithmetic (vllm_uma/plugin/precision.py).
BF16 = ["--dtype", "bfloat16"]
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
