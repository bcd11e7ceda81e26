"""Scheduler side: which host-pool rows can go back, and taking them out of use.

The pool's rows are handed out by our pool manager (kv_offload/pool_manager.py:
vLLM's CPUOffloadingManager, or its primary tier under a lower tier, with
the book of rows ours). A row is one of:

- not handed out (past the book's mark): never touched, or stale since the
  manager's ``reset_cache``; given back by the idle pass;
- on the free list: its bytes are stale (the block was evicted); its pages
  can go back at any time;
- holding a block (in the cache policy): being written, being read, or
  idle. Only idle rows are taken, by the manager's ``release_idle`` (the
  policy's own order: LRU first; vLLM's own eviction step). A later lookup
  of that key misses the pool; with a disk tier it hits the disk and is
  promoted into a fresh row.

Runs on the release thread under the scheduler's release lock
(memory_release/scheduler.py); this module only asks the manager and
advises the kernel about the rows' pages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from vllm.v1.kv_offload.base import OffloadKey

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.pool_manager import PoolManager
from vllm_uma.memory_release.pages import MADV_REMOVE, give_back


class Evicted(NamedTuple):
    rows: int
    given_back: int  # bytes that were resident


class PoolRows:
    def __init__(self, manager: PoolManager, pool: HostPool):
        if not isinstance(manager, PoolManager):
            raise TypeError(
                f"the memory release needs vllm-uma's pool manager, not "
                f"{type(manager).__name__}: the KV offloading spec is not vllm-uma's. Remove "
                f"'spec_name' and 'spec_module_path' from kv_connector_extra_config."
            )
        self._manager = manager
        self._pool = pool

    @property
    def row_bytes(self) -> int:
        return self._pool.row_bytes

    @property
    def num_rows(self) -> int:
        return self._pool.num_rows

    def rows_in_use(self) -> int:
        return self._manager.rows_in_use()

    def next_rows(self, count: int) -> list[int]:
        """The first ``count`` rows the manager's next stores take, in that order."""
        return self._manager.next_rows(count)

    def ranges(self, rows: list[int]) -> list:
        """The byte ranges of these rows."""
        base, size = self._pool.array.ctypes.data, self._pool.row_bytes
        return [(base + r * size, base + (r + 1) * size) for r in rows]

    def give_back_free_rows(
        self, past_mark: bool = False, keep: frozenset[int] = frozenset()
    ) -> int:
        """madvise the rows that hold no block; the bytes that were resident.

        Those are the free list's and, with ``past_mark``, the rows past the
        book's mark: never handed out, or not since the manager's
        ``reset_cache`` (vLLM's reset_prefix_cache with the connector), which
        forgets every row while their stale pages stay resident. Only when
        no request is in the engine: after a reset, a load the connector
        forgot can still be reading such a row for a waiting request. Rows
        in ``keep`` (the warm reserve) keep their pages."""
        book = self._manager.book
        given = self._give_back([r for r in book.free if r not in keep])
        if past_mark:
            past = range(book.mark, self._pool.num_rows)
            given += self._give_back([r for r in past if r not in keep])
        return given

    def evict(self, count: int, keep: Callable[[OffloadKey], bool] | None = None) -> Evicted:
        """Evict up to ``count`` idle rows, least recently used first,
        skipping keys ``keep`` says to keep; their pages go back."""
        rows = self._manager.release_idle(count, keep)
        return Evicted(len(rows), self._give_back(rows) if rows else 0)

    def holds(self, key: OffloadKey) -> bool:
        """The pool has this block, written and readable (tiers.BlockHolder)."""
        return self._manager.holds(key)

    def _give_back(self, rows: list[int]) -> int:
        # give_back merges adjacent rows: a run past the mark is one call.
        return give_back(self.ranges(rows), MADV_REMOVE)
