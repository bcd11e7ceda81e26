"""vllm-uma's default KV block of 32 tokens (vllm_uma/plugin/block_size.py),
through every tier, on the real server.

Two starts of the default model in float32 with no --block-size, a small
L1, a host pool and a disk tier on one root_dir (float32: the same tokens
whatever computed a prefix, on any CPU; tests/e2e/test_disk_tier.py says
why):

- A serves prompt 0 cold, then again at once (an L1 hit), then four other
  prompts that push it out of L1, then prompt 0 again (restored from the
  pool). vLLM reports each request's cached prompt tokens
  (--enable-prompt-tokens-details): the hit recomputes the partial last
  block only, fewer than 32 tokens, where vLLM CPU's 128-token blocks
  recomputed up to 127 (104 of a 1,000-token prompt).
- B, a new process on the same root_dir, serves prompt 0 from the disk
  tier, again with fewer than 32 tokens recomputed.

Every run of prompt 0 gives the same greedy tokens.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.traffic import EAGER, MODEL, metrics, prompt
from tools.harness.server import Server, metric
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS
from vllm_uma.plugin.memory import parse_breakdown

pytestmark = pytest.mark.slow

CACHED = "vllm:prompt_tokens_cached_by_source_total"


def server_args(root) -> list[str]:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 1}
    tiers = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return [
        *EAGER,
        *("--dtype", "float32", "--max-model-len", "2048"),
        # About 2,400 tokens of float32 KV: one 1,200-token prompt, not two.
        *("--kv-cache-memory-bytes", "110000000"),
        *("--kv-offloading-size", "0.3"),
        *("--kv-transfer-config", json.dumps(tiers)),
        "--enable-prompt-tokens-details",
    ]  # fmt: skip


def ask(server: Server, i: int) -> dict:
    reply = server.complete(MODEL, prompt(i, "Blocks"), 16, return_token_ids=True)
    usage = reply["usage"]
    return {
        "tokens": reply["choices"][0]["token_ids"],
        "prompt_tokens": usage["prompt_tokens"],
        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
    }


@pytest.fixture(scope="module")
def runs(vllm_uma_exe, default_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("block-size") / "kv"
    out = {}
    a = Server(vllm_uma_exe, server_args(root), root.parent / "a.log").wait_ready()
    try:
        out["cold"] = ask(a, 0)
        out["hit"] = ask(a, 0)
        for i in range(1, 5):
            ask(a, i)
        out["pool"] = ask(a, 0)
        out["a_metrics"] = metrics(a)
        out["a_log"] = a.log()
    finally:
        a.stop()  # a stop on purpose: the disk tier writes what it holds
    b = Server(vllm_uma_exe, server_args(root), root.parent / "b.log").wait_ready()
    try:
        out["disk"] = ask(b, 0)
        out["b_metrics"] = metrics(b)
    finally:
        b.stop()
    return out


def breakdown(log: str) -> dict:
    return parse_breakdown(next(x for x in log.splitlines() if "memory breakdown:" in x))


def test_the_server_runs_32_token_blocks_by_default(runs):
    assert breakdown(runs["a_log"])["block_size"] == DEFAULT_BLOCK_TOKENS == 32
    assert "KV cache blocks of 32 tokens (vLLM CPU's default is 128)" in runs["a_log"]


@pytest.mark.parametrize("kind", ["hit", "pool", "disk"])
def test_a_prefix_found_recomputes_fewer_than_32_tokens(runs, kind):
    run = runs[kind]
    # Every full block of the prompt but the last token's: vLLM computes at
    # least the last token, so a prompt of n tokens finds (n - 1) // 32 blocks.
    full = (run["prompt_tokens"] - 1) // 32 * 32
    assert run["cached"] == full, run
    assert run["prompt_tokens"] - run["cached"] < 33
    assert runs["cold"]["cached"] == 0


def test_the_tiers_were_the_source(runs):
    full = (runs["cold"]["prompt_tokens"] - 1) // 32 * 32
    assert metric(runs["a_metrics"], CACHED, 'source="host"') >= full  # the pool
    assert metric(runs["b_metrics"], CACHED, 'source="disk"') >= full  # the disk, after a restart


@pytest.mark.parametrize("kind", ["hit", "pool", "disk"])
def test_every_source_gives_the_cold_runs_tokens(runs, kind):
    assert runs[kind]["tokens"] == runs["cold"]["tokens"]
    assert len(set(runs["cold"]["tokens"])) > 2  # not a degenerate output
