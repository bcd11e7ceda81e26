"""The specs vLLM loads (vllm_uma/kv_offload/spec.py): where the disk tier finds the pool."""

from __future__ import annotations

import pytest

from vllm_uma.kv_offload import spec
from vllm_uma.plugin.engine_context import EngineContext


def test_the_disk_tier_refuses_a_worker_in_another_process():
    # No worker in this process opened the engine's pool.
    with pytest.raises(RuntimeError, match="the worker runs in another process"):
        spec.PoolRegion(EngineContext())


def test_the_disk_tier_shares_the_workers_pool():
    context = EngineContext()
    pool = context.host_pool.open(2, 4096)  # as the worker's mover does
    try:
        region = spec.PoolRegion(context)
        view = region.create_kv_memoryview()
        view.cast("B")[4096] = 9
        assert pool.array[1, 0] == 9
        view.release()
        region.cleanup()
        assert context.host_pool.existing() is pool
    finally:
        context.host_pool.release()
    assert context.host_pool.existing() is None


def test_another_engines_pool_is_not_this_ones():
    # Two engines in one process (two contexts): the disk tier of the one
    # without a worker finds no pool, though the other's is open.
    other = EngineContext()
    other.host_pool.open(2, 4096)
    try:
        with pytest.raises(RuntimeError, match="the worker runs in another process"):
            spec.PoolRegion(EngineContext())
    finally:
        other.host_pool.release()
