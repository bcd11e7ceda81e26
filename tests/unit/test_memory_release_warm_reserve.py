"""The warm reserve (vllm_uma/memory_release/warm_reserve.py): its size, and
faulting in the L1 blocks and pool rows the next request gets, on vLLM's
real BlockPool and offloading manager over real buffers (memory_release_kit:
free queue 5 7 2 1 4 3; 8 pool rows of 4 OS pages).
"""

from __future__ import annotations

import threading

import pytest
from memory_release_kit import BLOCK_PAGE, LAYERS, ROW, L1World, PoolWorld

from vllm_uma.memory_release import warm_reserve
from vllm_uma.memory_release.pages import PAGE, give_back, resident_bytes
from vllm_uma.memory_release.warm_reserve import ReserveSize, WarmReserve, reserve_size

BLOCK_BYTES = LAYERS * BLOCK_PAGE


@pytest.mark.parametrize(
    "tokens, l1_blocks, pool_rows, row_bytes, expected",
    [
        (8192, 1000, 200, 2 * 1000, ReserveSize(64, 32)),  # a row is two blocks
        (8000, 1000, 200, 2 * 1000, ReserveSize(63, 32)),  # whole blocks, rounded up
        (8192, 100, 200, 1000, ReserveSize(50, 64)),  # at most half of L1
        (8192, 1000, 20, 1000, ReserveSize(64, 10)),  # at most half of the pool
        (8192, 1000, 0, 0, ReserveSize(64, 0)),  # no pool
        (0, 1000, 200, 1000, ReserveSize(0, 0)),  # off
    ],
)
def test_reserve_size(tokens, l1_blocks, pool_rows, row_bytes, expected):
    assert reserve_size(tokens, 128, l1_blocks, 1000, pool_rows, row_bytes) == expected


def test_a_staging_pool_is_kept_resident_whole():
    # Every row is written again and again: none may fault on the path.
    size = reserve_size(8192, 128, 1000, 1000, 200, 1000, staging_pool=True)
    assert size == ReserveSize(64, 200)
    assert reserve_size(0, 128, 1000, 1000, 200, 1000, staging_pool=True) == ReserveSize(0, 0)


def test_chunks_cut_long_ranges_at_page_boundaries_only():
    ranges = [(0, 10 * PAGE), (20 * PAGE, 21 * PAGE)]
    chunks = warm_reserve._chunks(ranges, 4 * PAGE)
    assert chunks == [
        [(0, 4 * PAGE)],
        [(4 * PAGE, 8 * PAGE)],
        [(8 * PAGE, 10 * PAGE), (20 * PAGE, 21 * PAGE)],
    ]
    # Every byte once, in order.
    flat = [r for group in chunks for r in group]
    assert sum(e - s for s, e in flat) == sum(e - s for s, e in ranges)


def given_back_world() -> tuple[L1World, PoolWorld, WarmReserve]:
    """Every L1 block and pool row given back, as on a fresh server."""
    l1, pool = L1World(), PoolWorld()
    base = l1.kv.ctypes.data
    give_back([(base, base + l1.kv.nbytes)])
    reserve = WarmReserve(l1.l1, pool.rows, ReserveSize(l1_blocks=2, pool_rows=3))
    return l1, pool, reserve


def l1_resident(world: L1World, block: int) -> int:
    return sum(
        resident_bytes(
            world.kv[layer, block].ctypes.data, world.kv[layer, block].ctypes.data + BLOCK_PAGE
        )
        for layer in range(LAYERS)
    )


def test_warm_faults_in_exactly_the_next_blocks_and_rows():
    l1, pool, reserve = given_back_world()
    made = reserve.warm(reserve.ranges(), threading.Event())
    assert made == 2 * BLOCK_BYTES + 3 * ROW
    assert [l1_resident(l1, b) for b in range(8)] == [0, 0, 0, 0, 0, BLOCK_BYTES, 0, BLOCK_BYTES]
    rows = [resident_bytes(*pool.rows.ranges([r])[0]) for r in range(8)]
    assert rows == [ROW] * 3 + [0] * 5  # a fresh pool: rows 0 1 2 are taken next
    assert reserve.warm(reserve.ranges(), threading.Event()) == 0  # already warm
    pool.host.close()


def test_warm_keeps_what_the_pages_hold():
    l1, pool = L1World(), PoolWorld()
    reserve = WarmReserve(l1.l1, pool.rows, ReserveSize(2, 0))
    assert reserve.warm(reserve.ranges(), threading.Event()) == 0  # written: resident
    assert l1.zeroed_blocks() == []  # and every byte as it was
    pool.host.close()


def test_warm_follows_the_allocations():
    l1, pool, reserve = given_back_world()
    l1.pool.get_new_blocks(2)  # 5 and 7 are taken
    assert reserve.l1_blocks() == [2, 1]
    assert reserve.warm(reserve.ranges(), threading.Event()) == 2 * BLOCK_BYTES + 3 * ROW
    assert l1_resident(l1, 2) == l1_resident(l1, 1) == BLOCK_BYTES
    pool.host.close()


def test_a_stop_ends_the_warming_between_chunks():
    l1, pool, reserve = given_back_world()
    stop = threading.Event()
    stop.set()
    assert reserve.warm(reserve.ranges(), stop) == 0
    pool.host.close()


def test_a_kernel_refusal_turns_the_reserve_off_without_raising():
    _, pool, reserve = given_back_world()
    assert reserve.warm([(0, 4 * PAGE)], threading.Event()) == 0  # page 0: never mapped
    assert reserve.failed == "the kernel could not find the memory (Cannot allocate memory)"
    assert reserve.warm(reserve.ranges(), threading.Event()) == 0  # off from now on
    pool.host.close()


def test_bytes_is_the_reserves_size_in_each_tier():
    _, pool, reserve = given_back_world()
    assert reserve.bytes() == (2 * BLOCK_BYTES, 3 * ROW)
    assert WarmReserve(reserve.l1, None, ReserveSize(2, 3)).bytes() == (2 * BLOCK_BYTES, 0)
    assert WarmReserve(reserve.l1, None, ReserveSize(2, 3)).pool_rows() == []
    pool.host.close()
