"""The worker's inputs to the budget (vllm_uma/worker.py), on small fakes."""

from types import SimpleNamespace

import pytest

from vllm_uma.worker import kv_block_geometry, workers_sharing_ram


@pytest.mark.parametrize(
    "local_world_size, dp_local, expected",
    [(1, 1, 1), (2, 1, 2), (1, 0, 1), (2, 2, 4), (1, None, 1)],
)
def test_workers_sharing_ram(local_world_size, dp_local, expected):
    config = SimpleNamespace(local_world_size=local_world_size, data_parallel_size_local=dp_local)
    assert workers_sharing_ram(config) == expected


def test_block_geometry_sums_the_layers_pages():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=128, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
    per_block, block_size = kv_block_geometry({f"layer.{i}": spec for i in range(30)})
    # SmolLM2-135M: 23,040 bytes of KV per token, 128 tokens per block.
    assert (per_block, block_size) == (23_040 * 128, 128)
