"""KV offloading for a sliding-window model (Gemma 3 270M), through real servers.

Gemma 3 270M has 18 layers, 15 with a 512-token sliding window and 3 with
full attention; vLLM groups them into six KV cache groups of three layers
that draw on one set of blocks. vLLM's offloading connector keys each
group's blocks by (prefix hash, group), stores every block of every group,
and restores a prefix's blocks of the full-attention group but only the
blocks inside the window for the sliding groups.

- A (host pool + disk tier, an L1 of 152 blocks) serves prompts 0 and 1
  twice each (the second run is an L1 hit), four other prompts that push
  them out of L1, then 0 and 1 again: restored from the pool, they must give
  the L1 hit's tokens (same prefix split, the same KV bytes; fair in
  either precision the test serves, tests/e2e/traffic.py, and
  vllm_uma/models/oracles.py). A stops, writing its blocks to disk.
- B, a new server on the same disk tier, serves 0 and 1: restored from disk,
  the same tokens again.

The prompts (1,205 tokens) are longer than the window, so the sliding
groups' restore is a part of their blocks, and the bytes restored say so.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.traffic import (
    BLOCKS_OF_128,
    DTYPE,
    EAGER,
    EVICT_AND_REVISIT,
    complete,
    kv_bytes,
    metrics,
)
from tools.harness.server import Server, metric
from vllm_uma.plugin.memory import parse_breakdown

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m"
# One 128-token block of one group: 3 layers x 128 x 1,024 B in bf16.
GROUP_BLOCK_BYTES = kv_bytes(393_216)
L1_BYTES = kv_bytes(60_000_000)
FULL_BLOCKS = 9  # a 1,205-token prompt: 9 full blocks and a tail
GROUPS = 6
ORDER = EVICT_AND_REVISIT
SOURCE = "vllm:prompt_tokens_cached_by_source_total"
BYTES_MOVED = "vllm:kv_offload_total_bytes_total"


def server_args(root) -> list[str]:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 2}
    return [
        *EAGER,
        *BLOCKS_OF_128,
        *DTYPE,
        "--served-model-name",
        MODEL,
        # 152 blocks of 393,216 B (twice both in float32): about two of these prompts across all six
        # groups, so four more push the first two out.
        "--kv-cache-memory-bytes",
        str(L1_BYTES),
        "--max-model-len",
        "2048",
        "--kv-offloading-size",
        "0.5",
        "--kv-transfer-config",
        json.dumps({"kv_connector_extra_config": {"secondary_tiers": [tier]}}),
    ]


def counters(server) -> dict[str, float]:
    text = metrics(server)
    return dict(
        device=metric(text, SOURCE, 'source="device"'),
        host=metric(text, SOURCE, 'source="host"'),
        disk=metric(text, SOURCE, 'source="disk"'),
        restored=metric(text, BYTES_MOVED, 'transfer_type="CPU_to_GPU"'),
    )


@pytest.fixture(scope="module")
def runs(vllm_uma_exe, gemma_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma-store")
    args = [str(gemma_model_dir), *server_args(root)]
    results = {}
    a = Server(vllm_uma_exe, args, tmp_path_factory.mktemp("gemma-a") / "server.log")
    try:
        a.wait_ready()
        results["a"] = {step: complete(a, step[0], model=MODEL) for step in ORDER}
        results["a_counters"] = counters(a)
        results["a_log"] = a.log()
    finally:
        a.stop()
    b = Server(vllm_uma_exe, args, tmp_path_factory.mktemp("gemma-b") / "server.log")
    try:
        b.wait_ready()
        results["b"] = {i: complete(b, i, model=MODEL) for i in (0, 1)}
        results["b_counters"] = counters(b)
    finally:
        b.stop()
    return results


def test_a_pool_restore_gives_the_tokens_of_an_l1_hit(runs):
    a = runs["a"]
    for i in (0, 1):
        assert a[(i, "revisit")] == a[(i, "hit")], i
    # Not trivial: the two prompts continue differently.
    assert a[(0, "hit")] != a[(1, "hit")]


def test_the_revisits_came_from_the_pool_with_only_the_window_of_sliding_groups(runs):
    c = runs["a_counters"]
    # The L1 hits, then the two revisits' 9 full blocks each from the pool.
    assert c["device"] == 2 * FULL_BLOCKS * 128
    assert c["host"] == 2 * FULL_BLOCKS * 128
    # Restored: every block of the full-attention group, and for each of the
    # five sliding groups the blocks its 512-token window reaches (4 or 5),
    # not all nine.
    per_prompt_min = (FULL_BLOCKS + 5 * 4) * GROUP_BLOCK_BYTES
    per_prompt_all = FULL_BLOCKS * GROUPS * GROUP_BLOCK_BYTES
    assert 2 * per_prompt_min <= c["restored"] < 2 * per_prompt_all


def test_a_restart_restores_from_disk_with_the_same_tokens(runs):
    for i in (0, 1):
        assert runs["b"][i] == runs["a"][(i, "hit")], i
    c = runs["b_counters"]
    assert c["disk"] == 2 * FULL_BLOCKS * 128
    assert c["device"] == 0


def test_the_breakdown_counts_six_groups_on_one_set_of_blocks(runs):
    line = next(x for x in runs["a_log"].splitlines() if "memory breakdown:" in x)
    b = parse_breakdown(line)
    assert b["kv_groups"] == GROUPS and b["per_block_bytes"] == GROUP_BLOCK_BYTES
    assert b["num_blocks"] == L1_BYTES // GROUP_BLOCK_BYTES
    # vLLM's group-aware capacity, below blocks x 128 (which counts every
    # block as if one group used it).
    assert b["max_tokens_cached"] < b["num_blocks"] * b["block_size"]
