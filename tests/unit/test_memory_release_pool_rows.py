"""Host-pool rows by value (vllm_uma/memory_release/pool_rows.py), on our pool
manager (vLLM's real CPUOffloadingManager, LRU, with events) and a real HostPool; and the disk
tier's ``holds`` (vllm_uma/kv_offload/disk/tier.py): both answer
memory_release/tiers.py's BlockHolder.

Set-up (memory_release_kit.PoolWorld, 8 rows of 4 OS pages): keys k0..k5
stored in that order (rows 0..5), k0 then touched, so the LRU order is
k1 k2 k3 k4 k5 k0. Then a load of k2 is in flight (ref_cnt 1), a store of
k6 is pending (row 6, ref_cnt -1), and a failed store of k7 left row 7 on
the free list with stale bytes. Row r's bytes are all r + 1.
"""

from __future__ import annotations

import pytest
from disk_tier_kit import CTX as DISK_CTX
from disk_tier_kit import Jobs, Primary, held_io, make_tier
from disk_tier_kit import key as disk_key
from memory_release_kit import CTX, ROW, ROWS, PoolWorld, k
from vllm.v1.kv_offload.base import Medium, OffloadingEvent

from vllm_uma.kv_offload.disk import reports as disk_metrics
from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.pool_manager import UmaPoolManager
from vllm_uma.memory_release.pool_rows import PoolRows
from vllm_uma.memory_release.tiers import BlockHolder


@pytest.fixture
def pool():
    p = PoolWorld()
    assert p.store([k(i) for i in range(6)]) == [0, 1, 2, 3, 4, 5]
    p.manager.touch([k(0)], CTX)
    p.manager.prepare_load([k(2)], CTX)  # a load in flight
    assert p.prepare([k(6)]) == [6]  # a store in flight
    assert p.prepare([k(7)]) == [7]
    p.manager.complete_store([k(7)], CTX, success=False)  # row 7 back on the free list
    assert p.manager.book.free == [7]
    list(p.manager.take_events())
    yield p
    p.host.close()


def test_free_list_rows_go_back_and_nothing_else(pool):
    assert pool.rows.give_back_free_rows() == ROW
    assert pool.zero_rows() == [7]
    assert pool.manager.book.free == [7]  # still free: only its pages went
    assert pool.rows.rows_in_use() == 7


def test_evict_takes_least_recently_used_first_skipping_kept_and_busy_keys(pool):
    assert pool.rows.evict(3, keep=lambda key: key == k(1)).rows == 3
    # LRU: k1 (kept), k2 (load in flight), then k3 k4 k5; k6 (pending) and k0 stay.
    assert pool.removals() == [[k(3), k(4), k(5)]]
    assert pool.zero_rows() == [3, 4, 5]
    assert [pool.rows.holds(k(i)) for i in range(8)] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,  # pending: not readable yet
        False,
    ]
    assert pool.manager.book.free == [7, 3, 4, 5]
    assert pool.rows.rows_in_use() == 4


def test_evicted_rows_go_back_to_the_manager_for_the_next_store(pool):
    pool.rows.evict(3)
    assert pool.removals() == [[k(1), k(3), k(4)]]
    assert pool.manager.book.idle == 2  # k0 and k5
    # All 8 rows were handed out once: a store now takes freed rows (LIFO).
    assert pool.store([k(8), k(9), k(10)]) == [4, 3, 1]
    assert pool.rows.holds(k(8)) and not pool.rows.holds(k(1))
    # Full again: the manager's own eviction still counts right (k5, then k0).
    assert pool.store([k(11), k(12)]) == [5, 7]
    assert pool.removals() == [[k(5)]]


def test_evict_never_takes_more_than_the_idle_unkept_rows(pool):
    # Idle: k1 k3 k4 k5 k0; k0 kept, k2 loading, k6 storing.
    assert pool.rows.evict(100, keep=lambda key: key == k(0)).rows == 4
    assert pool.removals() == [[k(1), k(3), k(4), k(5)]]
    assert pool.zero_rows() == [1, 3, 4, 5]
    assert pool.rows.evict(100, keep=lambda key: key == k(0)).rows == 0


def test_evict_with_nothing_idle_evicts_nothing(pool):
    keep_all = lambda key: True  # noqa: E731
    assert pool.rows.evict(4, keep=keep_all).rows == 0
    assert pool.rows.evict(0).rows == 0
    assert pool.removals() == []
    assert pool.zero_rows() == []


def test_a_finished_load_makes_its_row_evictable_again(pool):
    pool.manager.complete_load([k(2)], CTX)
    pool.manager.complete_store([k(6)], CTX)
    assert pool.rows.evict(100).rows == 7
    assert sorted(pool.zero_rows()) == [0, 1, 2, 3, 4, 5, 6]
    assert pool.rows.rows_in_use() == 0


def test_removal_event_is_vllms_own(pool):
    pool.rows.evict(1)
    events = list(pool.manager.take_events())
    assert events == [OffloadingEvent(keys=[k(1)], medium=Medium.CPU, removed=True)]


def test_arc_policy_rows_are_left_alone():
    manager = UmaPoolManager(num_chunks=ROWS, cache_policy="arc", enable_events=True)
    host = HostPool(ROWS, ROW)
    manager.prepare_store([k(0)], CTX)
    manager.complete_store([k(0)], CTX)
    host.array[0] = 1
    assert PoolRows(manager, host).evict(1).rows == 0
    assert (host.array[0] == 1).all()
    host.close()


# -- the disk tier's holds: a written block file, with no side effect ---------


def test_disk_tier_holds_a_block_once_written(tmp_path, monkeypatch):
    primary = Primary()
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    primary.fill(0, seed=1)
    release = held_io(monkeypatch, "write_block")
    job = jobs.store([disk_key(0)], [0])
    assert not tier.holds(disk_key(0))  # being written
    release.set()
    assert jobs.wait(job)[0].success
    assert tier.holds(disk_key(0))
    assert not tier.holds(disk_key(1))
    stats = tier.get_stats()
    data = {} if stats is None else stats.data["data"]
    assert disk_metrics.NAMES.lookup_hits not in data  # holds is not a lookup
    tier.lookup(disk_key(0), DISK_CTX)
    assert disk_metrics.NAMES.lookup_hits in tier.get_stats().data["data"]


def test_the_pool_and_the_disk_tier_answer_the_releasers_one_question(tmp_path):
    # The scheduler picks the disk tier out of vLLM's secondary tiers by
    # this interface (memory_release/tiers.py), not by probing attributes.
    pool = PoolWorld()
    assert isinstance(pool.rows, BlockHolder)
    pool.host.close()
    tier = make_tier(tmp_path, Primary())
    assert isinstance(tier, BlockHolder)
    tier.shutdown()
    assert not isinstance(object(), BlockHolder)
    tier.shutdown()


def test_rows_a_reset_forgot_go_back_with_the_free_ones(pool):
    # vLLM's reset_prefix_cache with the connector (pause_generation with
    # clear_cache, /reset_prefix_cache?reset_external=true) resets the
    # manager: every row is unallocated again, its stale bytes still resident.
    pool.manager.reset_cache()
    assert pool.rows.rows_in_use() == 0
    assert pool.store([k(20), k(21)]) == [0, 1]  # handed out again from row 0
    pool.rows.give_back_free_rows()  # the pressure pass: a load may still read them
    assert pool.zero_rows() == []
    pool.rows.give_back_free_rows(past_mark=True)  # the idle pass: no request, no load
    assert pool.zero_rows() == [2, 3, 4, 5, 6, 7]


def test_next_rows_are_what_the_managers_next_stores_take(pool):
    # Every row is handed out (mark 8); the free list is [7].
    assert pool.rows.next_rows(3) == [7]
    fresh = PoolWorld()
    fresh.store([k(0), k(1)])
    assert fresh.rows.next_rows(3) == [2, 3, 4]  # past the mark, in order
    assert fresh.prepare([k(9), k(10), k(11)]) == [2, 3, 4]
    fresh.host.close()


def test_next_rows_after_the_mark_come_from_the_free_lists_end():
    p = PoolWorld()
    assert p.store([k(i) for i in range(6)]) == [0, 1, 2, 3, 4, 5]
    assert p.prepare([k(100), k(101)]) == [6, 7]
    p.manager.complete_store([k(100), k(101)], CTX, success=False)
    assert p.manager.book.free == [6, 7]
    assert p.rows.next_rows(3) == [7, 6]
    assert p.prepare([k(200), k(201)]) == [7, 6]
    p.host.close()


def test_free_rows_in_the_reserve_keep_their_pages(pool):
    assert pool.rows.give_back_free_rows(keep=frozenset({7})) == 0
    assert pool.zero_rows() == []
