"""Our pool manager (vllm_uma/kv_offload/pool_manager.py): vLLM's manager keeps
its book of rows in ours, so that a release of idle rows counts right in
vLLM's own figures, on the real CPUOffloadingManager and its primary tier.

The release through PoolRows, row by row and in LRU order:
test_memory_release_pool_rows.py.
"""

from __future__ import annotations

import pytest
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.pool_manager import RowBook, UmaPoolManager, UmaPrimaryTier

CTX = ReqContext(req_id="r")
ROWS = 4


def k(i: int) -> bytes:
    return bytes([i]) * 8


class Region:
    """The primary tier's mmap_region over a host pool: the two calls it makes."""

    def __init__(self):
        self.pool = HostPool(ROWS, 4096)

    def create_kv_memoryview(self) -> memoryview:
        return self.pool.kv_memoryview()

    def cleanup(self) -> None:
        pass


@pytest.fixture(params=["pool", "primary"])
def manager(request):
    if request.param == "pool":
        yield UmaPoolManager(num_chunks=ROWS, enable_events=True)
        return
    region = Region()
    tier = UmaPrimaryTier(num_chunks=ROWS, mmap_region=region, enable_events=True)
    yield tier
    tier.shutdown()
    region.pool.close()


def store(manager, keys):
    out = manager.prepare_store(keys, CTX)
    manager.complete_store(out.keys_to_store, CTX)
    return [int(r) for r in out.store_spec.block_ids]


def usage(manager) -> float:
    data = manager.get_stats().data["data"]
    return next(iter(data[CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC].values()))


def test_vllms_fields_are_the_book(manager):
    assert store(manager, [k(0), k(1), k(2)]) == [0, 1, 2]
    assert isinstance(manager.book, RowBook)
    assert (manager.book.mark, manager.book.free, manager.book.idle) == (3, [], 3)
    # No field of vLLM's on the instance: its methods read and write the book.
    fields = ("_num_allocated_chunks", "_free_list", "_num_evictable_cache_chunks")
    assert not set(fields) & set(vars(manager))
    assert manager._free_list is manager.book.free


def test_a_release_counts_in_vllms_own_figures(manager):
    store(manager, [k(0), k(1), k(2)])
    manager.prepare_load([k(1)], CTX)  # one row read: in use
    assert usage(manager) == pytest.approx(1 / ROWS)
    assert manager.release_idle(5, keep=lambda key: key == k(2)) == [0]
    assert (manager.book.mark, manager.book.free, manager.book.idle) == (3, [0], 1)
    # vLLM's figure counts the release: one row read, one idle, one free.
    assert usage(manager) == pytest.approx(1 / ROWS)
    assert manager.rows_in_use() == 2
    assert manager.next_rows(3) == [3, 0]
    # Its next store evicts k2 (the one idle row) onto the free list's end,
    # then takes the fresh row and the free list from its end.
    assert store(manager, [k(3), k(4), k(5)]) == [3, 2, 0]
    assert not manager.holds(k(2)) and manager.holds(k(5))


def test_a_reset_empties_the_book(manager):
    store(manager, [k(0), k(1)])
    manager.release_idle(1)
    manager.reset_cache()
    assert (manager.book.mark, manager.book.free, manager.book.idle) == (0, [], 0)
    assert store(manager, [k(7)]) == [0]
