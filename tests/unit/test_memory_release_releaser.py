"""The idle pass and the pressure pass (vllm_uma/memory_release/releaser.py).

First on tiny fakes that log every call, so the order and the counts asked
for are exact; then on the real pieces (vLLM's BlockPool and offloading
manager over real buffers, memory_release_kit). In both, ``rss`` is a
deterministic stand-in for VmRSS: the fakes' resident bytes, or the real
buffers' non-zero bytes.

Fake set-up (L1 blocks of 100 bytes, pool rows of 1000):

    L1 free queue   1 2 (uncached) 3 "a" 4 "d" 5 "x" 6 "y" 7 "z"; 2 in use
    pool rows, LRU  "a" "b" "c" idle, "e" loading; 2 rows on the free list
    on disk         "b" "d" "e"
"""

from __future__ import annotations

import pytest
from memory_release_kit import BLOCK_PAGE, CTX, LAYERS, ROW, L1World, PoolWorld, k

from vllm_uma.memory_release.l1_blocks import FreeBlocks
from vllm_uma.memory_release.pool_rows import Evicted
from vllm_uma.memory_release.releaser import Releaser, ReleaseReport
from vllm_uma.memory_release.warm_reserve import ReserveSize, WarmReserve

L1_BYTES, ROW_BYTES, OTHER = 100, 1000, 50_000


class Memory:
    def __init__(self):
        self.resident: dict[tuple, int] = {}
        self.log: list[tuple] = []

    def rss(self) -> int:
        return OTHER + sum(self.resident.values())


class FakeL1:
    block_bytes = L1_BYTES

    def __init__(self, memory: Memory, free: list[tuple[int, str | None]], in_use: int):
        self.memory, self.free, self.in_use = memory, dict(free), in_use
        for block in self.free:
            memory.resident["l1", block] = L1_BYTES

    def blocks_in_use(self) -> int:
        return self.in_use

    def free_blocks(self, held_below) -> FreeBlocks:
        found = FreeBlocks()
        for block, key in self.free.items():
            if key is None:
                found.uncached.append(block)
            elif held_below(key):
                found.held_below.append(block)
            else:
                found.only_here.append(block)
        return found

    def give_back(self, blocks: list[int]) -> int:
        self.memory.log.append(("L1", list(blocks)))
        given = 0
        for block in blocks:
            self.free[block] = None  # out of the prefix cache, still free
            given += self.memory.resident.pop(("l1", block), 0)
        return given


class FakePool:
    row_bytes = ROW_BYTES

    def __init__(self, memory: Memory, rows: list[tuple[str, int]], free_rows: int):
        self.memory, self.rows = memory, dict(rows)  # key -> ref_cnt, LRU first
        for key in self.rows:
            memory.resident["row", key] = ROW_BYTES
        for i in range(free_rows):
            memory.resident["free row", i] = ROW_BYTES

    def holds(self, key: str) -> bool:
        return self.rows.get(key, -1) >= 0

    def rows_in_use(self) -> int:
        return len(self.rows)

    def give_back_free_rows(self, past_mark: bool = False, keep=frozenset()) -> int:
        self.memory.log.append(("free rows", "past mark") if past_mark else ("free rows",))
        freed = [r for r in self.memory.resident if r[0] == "free row"]
        for r in freed:
            del self.memory.resident[r]
        return len(freed) * ROW_BYTES

    def evict(self, count: int, keep=None) -> int:
        idle = [key for key, ref in self.rows.items() if ref == 0]
        chosen = [key for key in idle if keep is None or not keep(key)][:count]
        self.memory.log.append(("evict", count, chosen))
        for key in chosen:
            del self.rows[key]
            del self.memory.resident["row", key]
        return Evicted(len(chosen), len(chosen) * ROW_BYTES)


ON_DISK = {"b", "d", "e"}


class FakeDisk:
    """The disk tier as the releaser sees it (tiers.BlockHolder)."""

    def __init__(self, keys):
        self.keys = set(keys)

    def holds(self, key) -> bool:
        return key in self.keys


def fakes(pool: bool = True, disk: bool = True) -> tuple[Memory, Releaser]:
    memory = Memory()
    free = [(1, None), (2, None), (3, "a"), (4, "d"), (5, "x"), (6, "y"), (7, "z")]
    l1 = FakeL1(memory, free, in_use=2)
    rows = FakePool(memory, [("a", 0), ("b", 0), ("c", 0), ("e", 1)], free_rows=2)
    releaser = Releaser(
        l1,
        rows if pool else None,
        FakeDisk(ON_DISK) if disk else None,
    )
    return memory, releaser


def test_held_below_is_the_pool_or_the_disk():
    _, releaser = fakes()
    assert [releaser.held_below(key) for key in "abdexz"] == [True] * 4 + [False] * 2
    _, bare = fakes(pool=False, disk=False)
    assert [bare.held_below(key) for key in "abd"] == [False] * 3


def test_idle_pass_gives_back_what_holds_nothing_or_is_held_below():
    memory, releaser = fakes()
    report = releaser.idle_pass()
    assert memory.log == [("L1", [1, 2]), ("free rows", "past mark"), ("L1", [3, 4])]
    assert report.steps == {
        "free L1 blocks": 200,
        "free pool rows": 2000,
        "L1 blocks held below": 200,
    }
    assert (report.total, report.l1_blocks, report.pool_rows) == (2400, 4, 0)
    # Kept: 2 blocks in use + 5 6 7 (only in L1), and all 4 pool rows.
    assert report.live_bytes == releaser.live_bytes() == 5 * L1_BYTES + 4 * ROW_BYTES
    assert report.describe() == (
        "free L1 blocks 0 KiB, free pool rows 2 KiB, L1 blocks held below 0 KiB"
    )


def test_idle_pass_without_pool_or_disk_keeps_every_cached_block():
    memory, releaser = fakes(pool=False, disk=False)
    report = releaser.idle_pass()
    assert memory.log == [("L1", [1, 2])]
    assert report.steps == {"free L1 blocks": 200}
    assert report.live_bytes == (2 + 5) * L1_BYTES


def test_pressure_pass_order_when_everything_is_wanted():
    memory, releaser = fakes()
    report = releaser.pressure_pass(1_000_000)
    assert memory.log == [
        ("L1", [1, 2]),
        ("free rows",),
        ("evict", 4, ["b"]),  # every idle row on disk ("e" is loading)
        ("L1", [3, 4]),  # held below: "a" in the pool, "d" on disk
        ("evict", 997, ["a", "c"]),  # lossy from here: the rest, LRU first
        ("L1", [5, 6, 7]),  # held nowhere else, least recently freed first
    ]
    assert report.steps == {
        "free L1 blocks": 200,
        "free pool rows": 2000,
        "pool rows on disk": 1000,
        "L1 blocks held below": 200,
        "pool rows": 2000,
        "L1 blocks held nowhere else": 300,
    }
    assert (report.l1_blocks, report.pool_rows) == (7, 3)
    assert report.live_bytes == 2 * L1_BYTES + 1 * ROW_BYTES  # in use, and "e"


LOSSLESS = [("free rows",), ("evict", 4, ["b"]), ("L1", [3, 4])]  # 3,400 bytes with L1 [1, 2]


@pytest.mark.parametrize(
    "shortfall, lossy",
    [
        (0, []),  # what costs only a restore goes whatever the shortfall
        (3_400, []),
        (3_401, [("evict", 1, ["a"])]),
        (4_401, [("evict", 2, ["a", "c"])]),
        (5_401, [("evict", 3, ["a", "c"]), ("L1", [5])]),
        (5_550, [("evict", 3, ["a", "c"]), ("L1", [5, 6])]),
    ],
)
def test_pressure_pass_stops_once_the_shortfall_is_met(shortfall, lossy):
    memory, releaser = fakes()
    report = releaser.pressure_pass(shortfall)
    assert memory.log == [("L1", [1, 2]), *LOSSLESS, *lossy]
    assert report.total >= min(shortfall, 5_700)


def test_pressure_pass_without_disk_evicts_pool_rows_lru_first():
    memory, releaser = fakes(disk=False)
    releaser.pressure_pass(1_000_000)
    assert memory.log == [
        ("L1", [1, 2]),
        ("free rows",),
        ("L1", [3]),  # "a" is in the pool
        ("evict", 998, ["a", "b", "c"]),
        ("L1", [4, 5, 6, 7]),  # nothing is held below any more
    ]


def test_pressure_pass_without_pool_goes_from_disk_to_l1_only():
    memory, releaser = fakes(pool=False)
    releaser.pressure_pass(350)
    assert memory.log == [("L1", [1, 2]), ("L1", [4]), ("L1", [3])]


def test_a_step_that_frees_nothing_resident_counts_nothing():
    memory, releaser = fakes()
    releaser.idle_pass()
    report = releaser.idle_pass()  # the same blocks again: uncached now, not resident
    assert memory.log[3:] == [("L1", [1, 2, 3, 4]), ("free rows", "past mark")]
    assert report.steps == {"free L1 blocks": 0, "free pool rows": 0}
    assert report.total == 0 and report.describe() == "nothing resident to give back"


def test_describe_names_each_step_in_mib_or_kib():
    report = ReleaseReport(
        steps={"free L1 blocks": 3 << 20, "pool rows": 0, "x": 1 << 30, "y": 12 << 10}
    )
    assert report.describe() == "free L1 blocks 3 MiB, x 1024 MiB, y 12 KiB"


# -- the real pieces ----------------------------------------------------------


class Real:
    """L1World and PoolWorld, with A's two blocks stored in the pool and B's
    first block on disk; the pool also holds k100 and k101 (on disk), and a
    failed store left row 5 on the free list."""

    def __init__(self):
        self.l1, self.pool = L1World(), PoolWorld()
        a_keys = [self.l1.key(self.l1.a, 0), self.l1.key(self.l1.a, 1)]
        assert self.pool.store([*a_keys, k(100), k(101)]) == [0, 1, 2, 3]
        assert self.pool.prepare([k(102)]) == [4]
        self.pool.manager.complete_store([k(102)], CTX, success=False)
        assert self.pool.prepare([k(103)]) == [5]  # a store in flight
        self.on_disk = {self.l1.key(self.l1.b, 0), k(101)}
        self.releaser = Releaser(self.l1.l1, self.pool.rows, FakeDisk(self.on_disk))


BLOCK_BYTES = LAYERS * BLOCK_PAGE


def test_idle_pass_on_the_real_pieces():
    real = Real()
    report = real.releaser.idle_pass()
    assert report.steps == {
        "free L1 blocks": 2 * BLOCK_BYTES,  # 5 and 7
        "free pool rows": ROW,  # row 4
        "L1 blocks held below": 3 * BLOCK_BYTES,  # 2 1 (pool) and 3 (disk)
    }
    assert real.l1.zeroed_blocks() == [1, 2, 3, 5, 7]
    assert real.pool.zero_rows() == [4, 6, 7]  # 6 and 7 were never used
    assert real.l1.cached(real.l1.a, 0) is None and real.l1.cached(real.l1.b, 1) == [4]
    # Kept: block 6 in use, block 4 only in L1; rows 0 1 2 3 5 hold blocks.
    assert report.live_bytes == 2 * BLOCK_BYTES + 5 * ROW


def test_pressure_pass_on_the_real_pieces():
    real = Real()
    report = real.releaser.pressure_pass(1 << 30)
    assert report.steps == {
        "free L1 blocks": 2 * BLOCK_BYTES,
        "free pool rows": ROW,
        "pool rows on disk": ROW,  # k101
        "L1 blocks held below": 3 * BLOCK_BYTES,  # 2 1 (pool) and 3 (B's first, disk)
        "pool rows": 3 * ROW,  # A's two rows and k100; k103 is being written
        "L1 blocks held nowhere else": BLOCK_BYTES,  # 4
    }
    assert real.l1.zeroed_blocks() == [1, 2, 3, 4, 5, 7]
    assert real.pool.zero_rows() == [0, 1, 2, 3, 4, 6, 7]
    assert [real.l1.cached(real.l1.a, i) for i in (0, 1)] == [None, None]
    assert [real.l1.cached(real.l1.b, i) for i in (0, 1)] == [None, None]
    assert real.l1.cached(real.l1.d, 0) == [6]
    assert (report.l1_blocks, report.pool_rows) == (6, 4)
    assert report.live_bytes == BLOCK_BYTES + ROW  # block 6 and row 5


def test_idle_pass_keeps_the_warm_reserve_and_puts_it_in_front():
    # The reserve is the front of the free queue (5 7) and the next rows
    # the manager takes (6 and 7 past the mark, then 4 from the free list).
    real = Real()
    reserve = WarmReserve(real.l1.l1, real.pool.rows, ReserveSize(l1_blocks=2, pool_rows=3))
    assert (reserve.l1_blocks(), reserve.pool_rows()) == ([5, 7], [6, 7, 4])
    real.releaser.reserve = reserve
    report = real.releaser.idle_pass()
    assert report.steps == {  # no "free L1 blocks" step: 5 and 7, the reserve
        "free pool rows": 0,  # row 4 (free list), 6 and 7 are the reserve
        "L1 blocks held below": 3 * BLOCK_BYTES,  # 2 1 (pool) and 3 (disk), as without it
    }
    assert real.l1.zeroed_blocks() == [1, 2, 3]
    assert real.pool.zero_rows() == [6, 7]  # row 4 keeps its (stale) bytes
    # The blocks just emptied were put in front; the reserve is back ahead.
    queue = real.l1.pool.free_block_queue.get_all_free_blocks()
    assert [b.block_id for b in queue][:2] == [5, 7]
    assert reserve.l1_blocks() == [5, 7]


def test_pressure_pass_gives_back_the_warm_reserve_too():
    real = Real()
    real.releaser.reserve = WarmReserve(real.l1.l1, real.pool.rows, ReserveSize(2, 3))
    report = real.releaser.pressure_pass(1 << 30)
    assert report.steps["free L1 blocks"] == 2 * BLOCK_BYTES  # 5 and 7
    assert report.steps["free pool rows"] == ROW  # row 4
    assert real.l1.zeroed_blocks() == [1, 2, 3, 4, 5, 7]


def test_idle_pass_keeps_resident_blocks_in_place_of_cold_reserve_blocks():
    # The reserve's blocks 5 and 7 were given back earlier (cold). Rather
    # than give back A's blocks 2 and 1 (resident, held in the pool) and
    # fault 5 and 7 in again, the pass empties 2 and 1 and keeps their
    # pages as the reserve; only B's block 3 goes back.
    real = Real()
    real.l1.l1.give_back([5, 7])
    reserve = WarmReserve(real.l1.l1, None, ReserveSize(l1_blocks=2, pool_rows=0))
    real.releaser.reserve = reserve
    report = real.releaser.idle_pass()
    assert report.steps["L1 blocks held below"] == BLOCK_BYTES  # 3 only
    assert real.l1.zeroed_blocks() == [3, 5, 7]  # 2 and 1 keep their bytes
    assert real.l1.cached(real.l1.a, 0) is None and real.l1.cached(real.l1.a, 1) is None
    queue = [b.block_id for b in real.l1.pool.free_block_queue.get_all_free_blocks()]
    assert queue[:4] == [2, 1, 5, 7]
    assert reserve.l1_blocks() == [2, 1]


@pytest.mark.parametrize("idle, kept_rows", [(True, []), (False, [6, 7])])
def test_pressure_pass_gives_back_the_reserves_fresh_rows_only_when_idle(idle, kept_rows):
    # Rows 6 and 7 (past the mark) are the reserve's, made resident; with a
    # request in, a load a cache reset forgot could still read such a row.
    real = Real()
    real.releaser.reserve = reserve = WarmReserve(real.l1.l1, real.pool.rows, ReserveSize(2, 3))
    import threading

    reserve.warm(reserve.ranges(), threading.Event())
    real.pool.host.array[6:8] = 9
    real.releaser.pressure_pass(0, idle=idle)
    assert [r for r in (6, 7) if real.pool.host.array[r].any()] == kept_rows


def test_live_bytes_count_the_warm_reserve():
    real = Real()
    before = real.releaser.live_bytes()
    real.releaser.reserve = WarmReserve(real.l1.l1, real.pool.rows, ReserveSize(2, 3))
    # 5 and 7 are free and uncached (not counted before); rows 6, 7, 4 hold
    # no block (not counted before).
    assert real.releaser.live_bytes() == before + 2 * BLOCK_BYTES + 3 * ROW


def test_after_a_pressure_pass_kv_kept_leaves_the_reserve_out():
    real = Real()
    real.releaser.reserve = WarmReserve(real.l1.l1, real.pool.rows, ReserveSize(2, 3))
    report = real.releaser.pressure_pass(1 << 30, idle=True)
    assert report.live_bytes == BLOCK_BYTES + ROW  # block 6 and row 5, as without it
