"""The specs vLLM loads (vllm_uma/kv_offload/spec.py): where the disk tier finds the pool."""

from __future__ import annotations

import pytest

from vllm_uma.kv_offload import spec
from vllm_uma.kv_offload.host_pool import SHARED_POOLS


def test_the_disk_tier_refuses_a_worker_in_another_process():
    # No worker in this process opened the engine's pool.
    with pytest.raises(RuntimeError, match="the worker runs in another process"):
        spec.PoolRegion("engine-without-a-worker-here")


def test_the_disk_tier_shares_the_workers_pool():
    pool = SHARED_POOLS.open("engine-test-region", 2, 4096)  # as the worker does
    try:
        region = spec.PoolRegion("engine-test-region")
        view = region.create_kv_memoryview()
        view.cast("B")[4096] = 9
        assert pool.array[1, 0] == 9
        view.release()
        region.cleanup()
        assert SHARED_POOLS.existing("engine-test-region") is pool
    finally:
        SHARED_POOLS.release("engine-test-region")
    assert SHARED_POOLS.existing("engine-test-region") is None
