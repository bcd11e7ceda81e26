"""Scheduler side: which free L1 blocks can go back, and taking them out of the cache.

vLLM's BlockPool keeps a freed block's prefix (its hash) until the block is
reused, so free blocks stay resident. A free block is one of:

- uncached (no hash: a partial last block, or a block already evicted): it
  holds nothing anyone can find; its pages can go back at any time;
- cached, and its prefix is also held below (a readable pool row, or a
  block file of the disk tier): worth less than its RAM, a later hit becomes
  a restore;
- cached and held nowhere else: dropping it means a later recompute, so it
  goes only under memory pressure, least recently freed first.

A cached block is dropped from the prefix cache (``BlockPool.evict_blocks``:
it emits the KV removal event) before its pages go back, so nothing can find
stale bytes: a hit becomes a restore or a recompute, never wrong data. A
block a store still reads (vLLM tracks it in the connector's
``_block_id_to_pending_jobs`` until the copy completes) is skipped: the copy
would read zeros. Blocks in use (``ref_cnt > 0``) are never touched.

The free queue's order is vLLM's eviction order (least recently freed
first), kept here for the pressure step. A block given back moves to the
front of that queue, so the next allocation takes an empty block before it
evicts a prefix still cached.

vLLM allocates from the front of that queue (``BlockPool.get_new_blocks``),
so its first blocks are the ones the next request gets: the warm reserve
(warm_reserve.py) keeps their pages resident, and the idle pass puts them
back in front after it gave other blocks back.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id
from vllm.v1.kv_offload.base import OffloadKey, make_offload_key

from vllm_uma.memory_release.l1_pages import L1PageMap
from vllm_uma.memory_release.pages import give_back, inward, resident_bytes
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class ReleaseError(RuntimeError):
    """A block to give back could still be read: nothing was given back."""


@dataclass
class FreeBlocks:
    uncached: list[int] = field(default_factory=list)
    held_below: list[int] = field(default_factory=list)  # cached, also in pool or disk
    only_here: list[int] = field(default_factory=list)  # cached, nowhere else; LRU first


class L1Blocks:
    def __init__(
        self,
        block_pool,
        page_map: L1PageMap,
        busy_blocks: Callable[[], Container[int]] = frozenset,
    ):
        self._pool = block_pool
        self._map = page_map
        # Free blocks a transfer still reads: not to be touched.
        self._busy_blocks = busy_blocks

    @property
    def block_bytes(self) -> int:
        return self._map.block_bytes

    def blocks_in_use(self) -> int:
        return sum(1 for b in self._pool.blocks if b.ref_cnt > 0 and not b.is_null)

    def free_blocks(self, held_below: Callable[[OffloadKey], bool]) -> FreeBlocks:
        busy = self._busy_blocks()
        found = FreeBlocks()
        for block in self._pool.free_block_queue.get_all_free_blocks():
            if block.is_null or block.block_id in busy:
                continue
            block_hash = block.block_hash
            if block_hash is None:
                found.uncached.append(block.block_id)
            elif held_below(offload_key(block_hash)):
                found.held_below.append(block.block_id)
            else:
                found.only_here.append(block.block_id)
        return found

    def next_free(self, count: int) -> list[int]:
        """The first ``count`` blocks vLLM's next allocations take, in that
        order: the front of the free queue, without the null block and
        blocks a transfer still reads (the walk stops after ``count``, not
        at the end of thousands of free blocks)."""
        if count <= 0:
            return []
        busy = self._busy_blocks()
        found: list[int] = []
        queue = self._pool.free_block_queue
        block = queue.fake_free_list_head.next_free_block
        while block is not None and block is not queue.fake_free_list_tail and len(found) < count:
            if not block.is_null and block.block_id not in busy:
                found.append(block.block_id)
            block = block.next_free_block
        return found

    def ranges(self, block_ids: list[int]) -> list:
        """The byte ranges of these blocks' pages, every layer."""
        return self._map.ranges(block_ids)

    def to_front(self, block_ids: list[int]) -> None:
        """Put these free blocks at the front of the free queue, in this
        order: the next allocations take them first."""
        blocks = self._pool.blocks
        moved = [blocks[b] for b in dict.fromkeys(block_ids) if blocks[b].ref_cnt == 0]
        queue = self._pool.free_block_queue
        for block in moved:
            queue.remove(block)
        queue.prepend_n(moved)

    def resident(self, block_ids: list[int], count: int) -> list[int]:
        """The first ``count`` of these blocks whose pages are all resident
        (mincore; a block is written whole, by a forward or a restore)."""
        found: list[int] = []
        for b in block_ids:
            if len(found) >= count:
                break
            pages = [inward(start, end) for start, end in self._map.ranges([b])]
            if all(p is None or resident_bytes(*p) == p[1] - p[0] for p in pages):
                found.append(b)
        return found

    def forget(self, block_ids: list[int]) -> list[int]:
        """Drop these free blocks from the prefix cache, keeping their pages:
        they hold nothing anyone can find any more. Raises ReleaseError if
        one is still in use or cached."""
        if not block_ids:
            return []
        self._pool.evict_blocks(set(block_ids))
        # Only blocks nothing can find any more: free, and without a hash.
        blocks = self._pool.blocks
        gone = [b for b in block_ids if blocks[b].ref_cnt == 0 and blocks[b].block_hash is None]
        if len(gone) != len(block_ids):
            raise ReleaseError(
                f"{len(block_ids) - len(gone)} of {len(block_ids)} KV blocks are still "
                f"in use or in the prefix cache after eviction; their pages are kept"
            )
        return gone

    def give_back(self, block_ids: list[int]) -> int:
        """Drop these free blocks from the prefix cache, then madvise their
        pages away; the bytes of them that were resident."""
        if not block_ids:
            return 0
        gone = self.forget(block_ids)
        blocks = self._pool.blocks
        given = give_back(self._map.ranges(gone))
        # To the front of the free queue: vLLM allocates from there, so an
        # empty block is reused before a block that still caches a prefix.
        queue = self._pool.free_block_queue
        released = [blocks[b] for b in dict.fromkeys(gone)]
        for block in released:
            queue.remove(block)
        queue.prepend_n(released)
        return given


def offload_key(block_hash) -> OffloadKey:
    """The offloading connector's key for an L1 block's hash (vLLM builds it
    from the request's block hash and the block's KV cache group)."""
    return make_offload_key(get_block_hash(block_hash), get_group_id(block_hash))
