"""Test kit for the KV memory release: vLLM's real BlockPool and offloading
manager over small real buffers whose bytes tell every block and row apart.

``L1World``: vLLM's BlockPool with vLLM's own requests (real block hashes)
over a private anonymous mapping standing in for the KV allocation:
2 layers, layer-outermost, each block's page two OS pages. Byte value
``10 * layer + block + 1`` everywhere. Blocks are 4 tokens.

    block ids      request        state after the set-up
    0              -              vLLM's null block
    1, 2           A (8 tokens)   freed, cached
    3, 4           B (8 tokens)   freed, cached
    5              C (2 tokens)   freed, partial: uncached
    6              D (4 tokens)   running: ref_cnt 1
    7              -              never used

    free queue (vLLM's eviction order): 5 7 2 1 4 3

``PoolWorld``: our pool manager, vLLM's CPUOffloadingManager (LRU, events on) handing out the
rows of a real HostPool, 8 rows of 4 OS pages; row r's bytes are r + 1.
"""

from __future__ import annotations

import mmap

import numpy as np
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.request import Request

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.pool_manager import UmaPoolManager
from vllm_uma.memory_release.l1_blocks import FreeBlocks, L1Blocks
from vllm_uma.memory_release.l1_pages import L1PageMap, LayerPages
from vllm_uma.memory_release.pages import PAGE
from vllm_uma.memory_release.pool_rows import PoolRows

BLOCK, NUM_BLOCKS, LAYERS = 4, 8, 2
BLOCK_PAGE = 2 * PAGE  # one layer's page of one block
ROWS, ROW = 8, 4 * PAGE
CTX = ReqContext(req_id="r")
init_none_hash(sha256)
HASHER = get_request_block_hasher(BLOCK, sha256)


def request(req_id: str, first_token: int, tokens: int) -> Request:
    prompt = list(range(first_token, first_token + tokens))
    return Request(req_id, prompt, SamplingParams(max_tokens=1), None, block_hasher=HASHER)


def k(i: int) -> bytes:
    """A pool key of no L1 block."""
    return make_offload_key(i.to_bytes(32, "big"), 0)


class L1World:
    def __init__(self, busy: set[int] | None = None):
        self.pool = BlockPool(NUM_BLOCKS, True, BLOCK, enable_kv_cache_events=True)
        region = mmap.mmap(
            -1, LAYERS * NUM_BLOCKS * BLOCK_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        )
        self.kv = np.frombuffer(region, dtype=np.uint8).reshape(LAYERS, NUM_BLOCKS, BLOCK_PAGE)
        for layer in range(LAYERS):
            for block in range(NUM_BLOCKS):
                self.kv[layer, block] = 10 * layer + block + 1
        base = self.kv.ctypes.data
        page_map = L1PageMap(
            num_blocks=NUM_BLOCKS,
            block_bytes=LAYERS * BLOCK_PAGE,
            layers=tuple(
                LayerPages(base + layer * NUM_BLOCKS * BLOCK_PAGE, BLOCK_PAGE, BLOCK_PAGE)
                for layer in range(LAYERS)
            ),
        )
        self.busy = set() if busy is None else busy
        self.l1 = L1Blocks(self.pool, page_map, lambda: self.busy)
        self.a, self.b = request("A", 0, 8), request("B", 100, 8)
        self.c, self.d = request("C", 200, 2), request("D", 300, 4)
        blocks = {r.request_id: self._run(r) for r in (self.a, self.b, self.c, self.d)}
        assert [[blk.block_id for blk in blocks[r]] for r in "ABCD"] == [[1, 2], [3, 4], [5], [6]]
        for r in "CAB":
            self.pool.free_blocks(reversed(blocks[r]))  # vLLM frees a request tail first
        assert [blk.block_id for blk in self.pool.free_block_queue.get_all_free_blocks()] == [
            5,
            7,
            2,
            1,
            4,
            3,
        ]
        self.pool.kv_event_queue.clear()

    def _run(self, req: Request):
        blocks = self.pool.get_new_blocks(-(-req.num_prompt_tokens // BLOCK))
        full = req.num_prompt_tokens // BLOCK
        self.pool.cache_full_blocks(req, blocks, 0, full, BLOCK, 0)
        return blocks

    def key(self, req: Request, index: int) -> bytes:
        """The offloading connector's key of the request's index-th block."""
        return make_offload_key(req.block_hashes[index], 0)

    def free(self, held_below: set[bytes]) -> FreeBlocks:
        return self.l1.free_blocks(lambda key: key in held_below)

    def cached(self, req: Request, index: int) -> list[int] | None:
        found = self.pool.get_cached_block(req.block_hashes[index], [0])
        return None if found is None else [blk.block_id for blk in found]

    def zeroed_blocks(self) -> list[int]:
        """Blocks whose pages read zero in every layer; any other block must
        hold all its bytes (a partly zeroed block fails)."""
        zero = [b for b in range(NUM_BLOCKS) if not self.kv[:, b].any()]
        for b in set(range(NUM_BLOCKS)) - set(zero):
            for layer in range(LAYERS):
                assert (self.kv[layer, b] == 10 * layer + b + 1).all(), (layer, b)
        return zero


class PoolWorld:
    def __init__(self):
        self.manager = UmaPoolManager(num_chunks=ROWS, cache_policy="lru", enable_events=True)
        self.host = HostPool(ROWS, ROW)
        self.rows = PoolRows(self.manager, self.host)

    def prepare(self, keys: list[bytes]) -> list[int]:
        out = self.manager.prepare_store(keys, CTX)
        rows = [int(r) for r in out.store_spec.block_ids]
        for row in rows:
            self.host.array[row] = row + 1  # what the worker's copy writes
        return rows

    def store(self, keys: list[bytes]) -> list[int]:
        rows = self.prepare(keys)
        self.manager.complete_store(keys, CTX)
        return rows

    def zero_rows(self) -> list[int]:
        """Rows that read zero; any other row must still hold its bytes."""
        zero = [r for r in range(ROWS) if not self.host.array[r].any()]
        for r in set(range(ROWS)) - set(zero):
            assert (self.host.array[r] == r + 1).all(), r
        return zero

    def removals(self) -> list[list[bytes]]:
        return [e.keys for e in self.manager.take_events() if e.removed]
