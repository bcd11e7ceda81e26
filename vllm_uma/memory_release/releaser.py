"""What to give back, in which order: the idle pass and the pressure pass.

Runs in the engine-core process under the scheduler's lock (scheduler.py),
so the block pool, the pool's manager and the disk tier's index do not move
underneath it.

Idle pass (the server has had no request for ``release_idle_seconds``):
  1. L1 blocks that are free and uncached (they hold nothing);
  2. pool rows on the free list (stale bytes), and rows past the pool
     manager's allocation mark (stale since a cache reset);
  3. L1 blocks that are free, cached, and also held by the pool or the
     disk tier (a later hit is a restore at close to memory speed).
  Pool rows that hold blocks stay: they are the fast restore path the user
  sized with --kv-offloading-size. The warm reserve (warm_reserve.py) stays
  too: the L1 blocks and pool rows the next request gets keep their pages,
  and its L1 blocks go back in front of the free queue afterwards. Where a
  reserve block is not resident, a resident block of steps 1 or 3 takes its
  place, emptied but not given back: a warm page kept is a fault saved.

Pressure pass (pressure.py says memory is short; ``shortfall`` bytes wanted).
First, whatever the shortfall, everything whose loss costs nothing but a
restore:
  1-2. as above (worth nothing);
  3. pool rows whose block is also on disk;
  4. L1 blocks that are free and held by the pool or the disk.
Then, least valuable first and only until the shortfall is covered, what a
later hit must recompute:
  5. other pool rows, least recently used first;
  6. L1 blocks that are free and held nowhere else, least recently freed
     first.
The warm reserve goes in the first steps like any other free block or row.
Running requests' blocks are never touched. Why everything lossless at
once: a machine short of memory needs it now, and a copy the disk keeps is
worth less than the RAM it holds (measured with memory_benchmark.py
--pressure: giving back only the shortfall left 27% of the server's idle
KV resident under the hog, and pressure came back a second later). The issue's order put the
pool's LRU rows before L1 blocks held below; an L1 block held below costs a
restore, a pool row held nowhere else a recompute, so the lossless L1 step
comes first.

What went back is the kernel's own figure: the pages of each step that were
resident just before their advice (pages.py, mincore), not what was advised,
which would count pages already given back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey

from vllm_uma.memory_release.l1_blocks import FreeBlocks, L1Blocks
from vllm_uma.memory_release.pool_rows import PoolRows
from vllm_uma.memory_release.tiers import BlockHolder
from vllm_uma.memory_release.warm_reserve import WarmReserve


@dataclass
class ReleaseReport:
    steps: dict[str, int] = field(default_factory=dict)  # step name -> bytes given back
    l1_blocks: int = 0  # free L1 blocks advised (some may have had no pages)
    pool_rows: int = 0  # pool rows given back
    live_bytes: int = 0  # KV the server keeps by design after the pass

    @property
    def total(self) -> int:
        return sum(self.steps.values())

    def describe(self) -> str:
        done = ", ".join(f"{name} {_size(b)}" for name, b in self.steps.items() if b)
        return done or "nothing resident to give back"


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


class Releaser:
    def __init__(
        self,
        l1: L1Blocks,
        pool: PoolRows | None = None,
        disk: BlockHolder | None = None,
        reserve: WarmReserve | None = None,
    ):
        self.l1 = l1
        self.pool = pool
        self.disk = disk
        self.reserve = reserve
        # Pool first: a row is the cheaper restore (tiers.py).
        self._below: list[BlockHolder] = [t for t in (pool, disk) if t is not None]

    def held_below(self, key: OffloadKey) -> bool:
        return any(tier.holds(key) for tier in self._below)

    def idle_pass(self) -> ReleaseReport:
        report = ReleaseReport()
        free = self.l1.free_blocks(self.held_below)
        warm, cold, kept = self._keep_warm(free)
        skip = set(warm) | set(cold) | set(kept)
        self._l1_step(report, "free L1 blocks", [b for b in free.uncached if b not in skip])
        warm_rows = frozenset(self.reserve.pool_rows()) if self.reserve is not None else frozenset()
        # No request: no load in flight.
        self._pool_free_step(report, past_mark=True, keep=warm_rows)
        self._l1_step(report, "L1 blocks held below", [b for b in free.held_below if b not in skip])
        if skip:
            # Given-back blocks went to the front: the reserve goes back
            # ahead of them, its resident blocks first.
            self.l1.to_front(warm + kept + cold)
        report.live_bytes = self.live_bytes()
        return report

    def _keep_warm(self, free: FreeBlocks) -> tuple[list[int], list[int], list[int]]:
        """The warm reserve's blocks (the front of the free queue), resident
        and not; and for each one not resident, a resident block this pass
        would have given back, emptied instead (out of the prefix cache, its
        pages kept): faulting a cold block in later would cost what giving a
        warm one back saves. ``free`` is this pass's walk of the free queue;
        the blocks kept leave its lists' use through the caller's skip set."""
        if self.reserve is None:
            return [], [], []
        front = self.reserve.l1_blocks()
        warm = self.l1.resident(front, len(front))
        resident = set(warm)
        cold = [b for b in front if b not in resident]
        if not cold:
            return warm, [], []
        taken = set(front)
        candidates = [b for b in free.uncached + free.held_below if b not in taken]
        kept = self.l1.forget(self.l1.resident(candidates, len(cold)))
        return warm, cold, kept

    def pressure_pass(self, shortfall: int, idle: bool = False) -> ReleaseReport:
        report = ReleaseReport()
        # Lossless, whatever the shortfall: what holds nothing, pool rows
        # the disk also keeps, L1 blocks the pool or the disk also keeps.
        free = self.l1.free_blocks(self.held_below)
        self._l1_step(report, "free L1 blocks", free.uncached)
        # Rows past the allocation mark (the warm reserve's among them) only
        # when no request is in: after a cache reset a load may read them.
        self._pool_free_step(report, past_mark=idle)
        if self.pool is not None and self.disk is not None:
            disk = self.disk
            everything = self.pool.rows_in_use()
            self._pool_evict_step(
                report, "pool rows on disk", everything, lambda k: not disk.holds(k)
            )
        free = self.l1.free_blocks(self.held_below)  # pool rows just left
        self._l1_step(report, "L1 blocks held below", free.held_below)
        # Lossy (a later hit recomputes): only as far as the shortfall needs.
        if self.pool is not None and report.total < shortfall:
            rows = -(-(shortfall - report.total) // self.pool.row_bytes)
            self._pool_evict_step(report, "pool rows", rows)
        if report.total < shortfall:
            free = self.l1.free_blocks(self.held_below)
            blocks = -(-(shortfall - report.total) // self.l1.block_bytes)
            self._l1_step(report, "L1 blocks held nowhere else", free.only_here[:blocks])
        # The reserve went back with the rest, and stays out until the
        # pressure is over.
        report.live_bytes = self.live_bytes(with_reserve=False)
        return report

    def live_bytes(self, with_reserve: bool = True) -> int:
        """L1 blocks in use or cached only in L1, plus pool rows holding a
        block, plus (``with_reserve``) the warm reserve's free blocks and
        rows: what the server keeps by design."""
        free = self.l1.free_blocks(self.held_below)
        reserve = self.reserve if with_reserve else None
        warm = set(reserve.l1_blocks()) if reserve is not None else set()
        kept = len(set(free.only_here) | warm)
        l1 = (self.l1.blocks_in_use() + kept) * self.l1.block_bytes
        pool = 0 if self.pool is None else self.pool.rows_in_use() * self.pool.row_bytes
        if reserve is not None and self.pool is not None:
            pool += len(reserve.pool_rows()) * self.pool.row_bytes
        return l1 + pool

    # -- steps: each counts the resident bytes it gave back -----------------

    def _l1_step(self, report: ReleaseReport, name: str, blocks: list[int]) -> None:
        if not blocks:
            return
        self._record(report, name, self.l1.give_back(blocks))
        report.l1_blocks += len(blocks)

    def _pool_free_step(
        self, report: ReleaseReport, past_mark: bool = False, keep: frozenset[int] = frozenset()
    ) -> None:
        if self.pool is not None:
            given = self.pool.give_back_free_rows(past_mark, keep)
            self._record(report, "free pool rows", given)

    def _pool_evict_step(self, report, name: str, rows: int, keep=None) -> None:
        evicted = self.pool.evict(rows, keep)
        report.pool_rows += evicted.rows
        self._record(report, name, evicted.given_back)

    def _record(self, report: ReleaseReport, name: str, given: int) -> None:
        report.steps[name] = report.steps.get(name, 0) + given
