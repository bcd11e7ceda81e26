"""KV offloading to the host pool (L2), through the real server.

L1 is made small (--kv-cache-memory-bytes: 33 blocks, 4,224 tokens) so that
six distinct 1,200-token prompts push the first two out of it; revisiting
them must restore from L2 (vLLM's offload metrics count the bytes) and give
the same greedy tokens as a server without offloading.
"""

from __future__ import annotations

import re

import pytest
import requests

from tests.e2e.server import Server
from vllm_uma.memory import parse_breakdown

pytestmark = pytest.mark.slow

SMALL_L1 = ["--kv-cache-memory-bytes", "100000000", "--max-model-len", "2048"]
ORDER = [0, 1, 2, 3, 4, 5, 0, 1]  # 0 and 1 have left L1 when they come back
WORDS = ["apple", "river", "stone", "cloud", "green", "light", "table", "music"]


def prompt(i: int) -> str:
    return f"Story {i}: " + " ".join(WORDS[(i + k) % 8] + str(k % 10) for k in range(600))


def run_traffic(server) -> list[list[int]]:
    outputs = []
    for i in ORDER:
        reply = server.post(
            "/v1/completions",
            {
                "model": "SmolLM2-135M-Instruct",
                "prompt": prompt(i),
                "max_tokens": 16,
                "temperature": 0,
                "return_token_ids": True,
            },
        )
        outputs.append(reply["choices"][0]["token_ids"])
    return outputs


def metric(server, name: str, transfer_type: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    pattern = rf'^{re.escape(name)}\{{[^}}]*transfer_type="{transfer_type}"[^}}]*\}} (\S+)$'
    values = [float(v) for v in re.findall(pattern, text, flags=re.M)]
    return sum(values)


@pytest.fixture(scope="module")
def runs(vllm_uma_exe, default_model_dir, tmp_path_factory):
    results = {}
    for name, extra in (("off", []), ("pool", ["--kv-offloading-size", "1"])):
        log = tmp_path_factory.mktemp(f"offload-{name}") / "server.log"
        srv = Server(vllm_uma_exe, SMALL_L1 + extra, log).wait_ready()
        try:
            outputs = run_traffic(srv)
            restored = metric(srv, "vllm:kv_offload_total_bytes_total", "CPU_to_GPU")
            stored = metric(srv, "vllm:kv_offload_total_bytes_total", "GPU_to_CPU")
            results[name] = dict(outputs=outputs, restored=restored, stored=stored, log=srv.log())
        finally:
            srv.stop()
    return results


def test_outputs_with_the_pool_equal_outputs_without(runs):
    assert runs["pool"]["outputs"] == runs["off"]["outputs"]


def test_revisits_are_restored_from_the_pool(runs):
    assert runs["pool"]["stored"] > 0
    # Prompts 0 and 1 come back: at least 8 full blocks each of 2,949,120 B.
    assert runs["pool"]["restored"] >= 2 * 8 * 2_949_120


def test_without_offloading_nothing_moves(runs):
    assert runs["off"]["restored"] == 0 and runs["off"]["stored"] == 0


def test_the_pool_is_in_the_breakdown(runs):
    line = next(x for x in runs["pool"]["log"].splitlines() if "memory breakdown:" in x)
    assert parse_breakdown(line)["kv_offload_pool"] == 1 << 30
    assert "KV offloading: host pool of 1.00 GiB (--kv-offloading-size)." in runs["pool"]["log"]
