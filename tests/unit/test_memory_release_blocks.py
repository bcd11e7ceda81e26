"""Free L1 blocks by value, and taking them out of the prefix cache
(vllm_uma/memory_release/l1_blocks.py), on vLLM's real BlockPool.

The set-up is memory_release_kit.L1World (blocks 1-2 request A, 3-4 B,
5 partial, 6 running, 7 never used; free queue 5 7 2 1 4 3); A's prefix is
the one held below (by the pool or the disk tier).
"""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from memory_release_kit import BLOCK, BLOCK_PAGE, LAYERS, NUM_BLOCKS, L1World
from vllm.distributed.kv_events import BlockRemoved
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id, maybe_convert_block_hash
from vllm.v1.kv_offload.base import make_offload_key

from vllm_uma.memory_release.l1_blocks import FreeBlocks, L1Blocks, ReleaseError, offload_key
from vllm_uma.memory_release.l1_pages import L1PageMap, LayerPages
from vllm_uma.memory_release.pages import PAGE


@pytest.fixture
def world() -> L1World:
    return L1World()


def free_order(world: L1World) -> list[int]:
    return [b.block_id for b in world.pool.free_block_queue.get_all_free_blocks()]


def held_below(world: L1World) -> set[bytes]:
    """Request A's keys: what the pool or the disk tier holds here."""
    return {world.key(world.a, 0), world.key(world.a, 1)}


def test_free_blocks_are_sorted_by_value_in_vllms_eviction_order(world):
    assert world.free(held_below(world)) == FreeBlocks(
        uncached=[5, 7], held_below=[2, 1], only_here=[4, 3]
    )


def test_held_below_is_asked_with_the_connectors_offload_key(world):
    asked = []
    world.l1.free_blocks(lambda key: asked.append(key) or False)
    hashes = [world.a.block_hashes[1], world.a.block_hashes[0]]
    hashes += [world.b.block_hashes[1], world.b.block_hashes[0]]
    assert asked == [make_offload_key(h, 0) for h in hashes]


def test_offload_key_is_vllms_key_of_the_hash_and_group():
    block_hash = sha256((1, 2, 3))
    for group in (0, 1, 7):
        key = offload_key(make_block_hash_with_group_id(block_hash, group))
        assert key == make_offload_key(block_hash, group)
        assert key[-4:] == group.to_bytes(4, "big")


def test_blocks_a_transfer_still_reads_are_never_listed():
    world = L1World(busy={7, 1, 4})
    assert world.free(held_below(world)) == FreeBlocks(uncached=[5], held_below=[2], only_here=[3])
    world.busy.clear()
    assert world.free(held_below(world)) == FreeBlocks(
        uncached=[5, 7], held_below=[2, 1], only_here=[4, 3]
    )


def test_blocks_in_use_are_never_listed(world):
    # A prefix hit on B's first block takes it out of the free queue.
    world.pool.touch([world.pool.blocks[3]])
    # vLLM touches the null block too (a sliding window's skipped blocks);
    # its ref_cnt is not maintained and it is never counted.
    world.pool.touch([world.pool.null_block])
    assert world.pool.null_block.ref_cnt == 1
    assert world.l1.blocks_in_use() == 2  # D's block and the hit
    assert world.free(held_below(world)) == FreeBlocks(
        uncached=[5, 7], held_below=[2, 1], only_here=[4]
    )


def test_give_back_drops_the_blocks_from_the_prefix_cache(world):
    assert world.cached(world.a, 0) == [1] and world.cached(world.b, 1) == [4]
    world.l1.give_back([2, 1, 4])
    assert world.cached(world.a, 0) is None
    assert world.cached(world.a, 1) is None
    assert world.cached(world.b, 1) is None
    assert world.cached(world.b, 0) == [3]  # a neighbour stays findable
    assert world.cached(world.d, 0) == [6]
    removed = [e for e in world.pool.kv_event_queue if isinstance(e, BlockRemoved)]
    hashes = [world.a.block_hashes[0], world.a.block_hashes[1], world.b.block_hashes[1]]
    assert len(removed) == 3
    assert {h for e in removed for h in e.block_hashes} == set(
        map(maybe_convert_block_hash, hashes)
    )
    # They stay free, now holding nothing, at the front of the free queue:
    # the next allocation takes them before it evicts 3, still cached.
    assert world.free(held_below(world)) == FreeBlocks(
        uncached=[2, 1, 4, 5, 7], held_below=[], only_here=[3]
    )
    assert world.pool.free_block_queue.num_free_blocks == 6


def test_give_back_zeroes_exactly_the_blocks_pages(world):
    advised = world.l1.give_back([2, 1, 4])
    assert advised == 3 * LAYERS * BLOCK_PAGE
    assert world.zeroed_blocks() == [1, 2, 4]
    assert world.l1.block_bytes == LAYERS * BLOCK_PAGE


def test_a_block_in_use_is_refused_and_nothing_is_given_back(world):
    with pytest.raises(ReleaseError, match="1 of 2 KV blocks are still in use"):
        world.l1.give_back([5, 6])  # 6 is D's running block
    assert world.zeroed_blocks() == []


def test_giving_back_nothing_does_nothing(world):
    assert world.l1.give_back([]) == 0
    assert world.zeroed_blocks() == []
    assert world.cached(world.a, 0) == [1]


def test_a_block_page_smaller_than_an_os_page_keeps_its_shared_pages():
    # Four blocks share each OS page here; giving back one never zeroes
    # the three others: only pages wholly inside the given blocks go back.
    pool = BlockPool(NUM_BLOCKS, True, BLOCK)
    region = mmap.mmap(-1, 2 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    kv = np.frombuffer(region, dtype=np.uint8).reshape(NUM_BLOCKS, PAGE // 4)
    kv[:] = np.arange(1, NUM_BLOCKS + 1, dtype=np.uint8)[:, None]
    quarter = PAGE // 4
    page_map = L1PageMap(NUM_BLOCKS, quarter, (LayerPages(kv.ctypes.data, quarter, quarter),))
    l1 = L1Blocks(pool, page_map)
    assert l1.give_back([1]) == 0
    assert l1.give_back([4, 5, 6]) == 0  # three quarters of page 1
    assert (kv == np.arange(1, NUM_BLOCKS + 1)[:, None]).all()
    assert l1.give_back([7, 4, 6, 5]) == PAGE
    assert not kv[4:].any() and (kv[:4] == np.arange(1, 5)[:, None]).all()


def test_next_free_is_what_vllms_next_allocations_take(world):
    # Free queue: 5 7 2 1 4 3. vLLM's get_new_blocks takes from its front.
    assert world.l1.next_free(3) == [5, 7, 2]
    assert world.l1.next_free(0) == []
    assert world.l1.next_free(100) == [5, 7, 2, 1, 4, 3]  # stops at the end
    taken = [b.block_id for b in world.pool.get_new_blocks(3)]
    assert taken == [5, 7, 2]
    assert world.l1.next_free(2) == [1, 4]


def test_next_free_skips_blocks_a_transfer_still_reads():
    world = L1World(busy={7, 2})
    assert world.l1.next_free(3) == [5, 1, 4]


def test_to_front_puts_free_blocks_first_in_the_order_given(world):
    world.l1.to_front([4, 3])
    assert free_order(world) == [4, 3, 5, 7, 2, 1]
    world.l1.to_front([6])  # in use: not in the free queue, left alone
    assert free_order(world) == [4, 3, 5, 7, 2, 1]
    assert world.cached(world.b, 0) == [3]  # still cached: only its place moved
