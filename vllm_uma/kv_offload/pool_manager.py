"""Scheduler side: the host pool's manager, vLLM's, with the pool's rows ours.

vLLM's CPUOffloadingManager decides which block goes in which row of the
host pool (its cache policy, LRU by default) and keeps the book of rows in
three private fields: the allocation mark (rows below it were handed out),
the free list (handed-out rows holding no block) and the count of idle rows
(rows holding a block no transfer uses). The memory release changes that
book too: it evicts idle rows and gives their pages back. vLLM 0.32 has no
public method for either, so the book is ours:

- ``RowBook`` holds the mark, the free list and the idle count;
- ``PoolManager``, mixed into vLLM's manager (``UmaPoolManager``, the host
  pool alone) or into its primary tier under a disk or network tier
  (``UmaPrimaryTier``), gives vLLM's three field names to the book
  (properties): vLLM's own methods (allocation, prepare_store's eviction,
  complete_store, reset_cache, get_stats) keep it as they kept their
  fields, and nothing of ours writes a field of vLLM's. It adds the public
  methods the release needs: ``rows_in_use``, ``next_rows``, ``holds``,
  ``release_idle``.

``release_idle`` is vLLM's eviction step (prepare_store's), run on demand:
the cache policy's public ``evict`` takes idle rows, least recently used
first; the book counts them out of the idle ones and onto the free list; a
removal KV event announces them, as vLLM's step does. The contract
(plugin/vllm_contract/entries_release.py) checks that vLLM's step and its
three fields are still the ones this module knows.

Process and threads: the engine-core process. vLLM's engine thread calls
the manager from the scheduler's methods (lookups, loads and stores and
their completion, resets, stats); the memory release thread
(memory_release/) calls ``release_idle`` and reads the book. Both hold the
scheduler's release lock (memory_release/scheduler.py: every scheduler
method that reaches the manager takes it), so neither sees the other's
change half done; the manager takes no lock of its own. Nothing crosses
processes: row numbers reach the worker's mover in vLLM's load and store
specs.

Upstream, a public ``CPUOffloadingManager.evict(n, protected)`` (its
prepare_store step) and a read-only view of its free rows would make the
properties unnecessary.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.kv_offload.base import OffloadingEvent, OffloadKey
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.tiering.manager import CPUPrimaryTierOffloadingManager

from vllm_uma.kv_offload.pins.pool_policy import IsPinned, PinAware
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class RowBook:
    """The pool's rows: ``mark`` of them handed out; of those, the ``free``
    ones hold no block (their bytes are stale), and ``idle`` of the others
    hold a block no transfer uses (evictable)."""

    def __init__(self, num_rows: int):
        self.num_rows = num_rows
        self.mark = 0
        self.free: list[int] = []
        self.idle = 0


def _in_book(field: str) -> property:
    """A field vLLM's manager reads and assigns, kept in our book."""
    return property(
        lambda self: getattr(self.book, field),
        lambda self, value: setattr(self.book, field, value),
        doc=f"vLLM's name for RowBook.{field}",
    )


class PoolManager:
    """The rows of vLLM's manager ours (module docstring); mixed in first."""

    _num_allocated_chunks = _in_book("mark")
    _free_list = _in_book("free")
    _num_evictable_cache_chunks = _in_book("idle")

    def __init__(self, *, num_chunks: int, **kwargs):
        # Before vLLM's __init__, which sets the three fields: in the book.
        self.book = RowBook(num_chunks)
        self._is_pinned: IsPinned | None = None
        super().__init__(num_chunks=num_chunks, **kwargs)

    def keep_pinned(self, is_pinned: IsPinned) -> bool:
        """Keep the blocks ``is_pinned`` names (pins/): vLLM's eviction
        through the policy, ours in ``release_idle``. False if the policy is
        not pin-aware (a user's own): then pins hold in the disk tier only."""
        policy = self._policy
        if not isinstance(policy, PinAware):
            return False
        policy.set_pinned(is_pinned)
        self._is_pinned = is_pinned
        return True

    def rows_in_use(self) -> int:
        """Rows holding a block (being written, read or idle)."""
        return self.book.mark - len(self.book.free)

    def next_rows(self, count: int) -> list[int]:
        """The first ``count`` rows the next stores take, in that order:
        rows past the mark first, then the free list from its end (vLLM's
        ``_allocate_chunks``)."""
        book = self.book
        fresh = list(range(book.mark, min(book.num_rows, book.mark + count)))
        reused = book.free[::-1][: max(0, count - len(fresh))]
        return fresh + reused

    def holds(self, key: OffloadKey) -> bool:
        """The pool has this block, written and readable."""
        chunk = self._policy.get(key)
        return chunk is not None and chunk.is_ready

    def release_idle(
        self, count: int, keep: Callable[[OffloadKey], bool] | None = None
    ) -> list[int]:
        """Evict up to ``count`` idle rows, least recently used first,
        skipping keys ``keep`` says to keep and pinned ones; the rows, now
        on the free list."""
        idle = self._idle_keys()
        pinned = self._is_pinned
        protected = {
            key
            for key in idle
            if (keep is not None and keep(key)) or (pinned is not None and pinned(key))
        }
        count = min(count, len(idle) - len(protected))
        if count <= 0:
            return []
        evicted = self._policy.evict(count, protected)
        if evicted is None:
            return []
        # prepare_store's own step: out of the idle count, onto the free
        # list, announced as removed.
        self.book.idle -= len(evicted)
        rows = [chunk.chunk_id for _, chunk in evicted]
        self.book.free.extend(rows)
        if self.events is not None:
            self.events.append(
                OffloadingEvent(keys=[key for key, _ in evicted], medium=self.medium, removed=True)
            )
        return rows

    def _idle_keys(self) -> list[OffloadKey]:
        chunks = getattr(self._policy, "chunks", None)
        if chunks is None:  # a policy that does not expose its entries (ARC)
            return []
        return [key for key, chunk in chunks.items() if chunk.ref_cnt == 0]


class UmaPoolManager(PoolManager, CPUOffloadingManager):
    """The host pool alone (UmaOffloadingSpec)."""


class UmaPrimaryTier(PoolManager, CPUPrimaryTierOffloadingManager):
    """The host pool as the primary tier over a disk or network tier
    (UmaTieredOffloadingSpec)."""
