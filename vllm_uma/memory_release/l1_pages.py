"""Worker side: where each L1 KV block's bytes are, to give them back.

vLLM 0.32 puts the whole KV cache in one backing allocation and describes
its placement in the ``KVCacheConfig`` (``KVCacheTensor``): layer ``l`` of
block ``b`` starts at ``offset + l * layer_stride + b * block_stride``, for
``page`` bytes (the layer's ``page_size_bytes``). For the default model the
layout is layer-outermost, so a run of adjacent free blocks is one range
per layer:

    backing allocation
    +-- layer 0 -------------------+-- layer 1 ----------- ... --+
    | blk 0 | blk 1 | ... | blk N-1 | blk 0 | blk 1 | ...         |
    +-------+-------+-----+---------+-------+-------+-------------+
    offset  +page                   offset + layer_stride

The worker builds the map once the KV cache exists and leaves it in the
``L1PageRegistry`` of its engine's context (plugin/engine_context.py); the
scheduler's release thread, in the same engine-core process, reads it
there: only addresses cross, never tensors.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from vllm_uma.memory_release.pages import Range
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


@dataclass(frozen=True)
class LayerPages:
    """One layer's pages: block b is [first + b * block_stride, + page)."""

    first: int
    block_stride: int
    page: int


@dataclass(frozen=True)
class L1PageMap:
    num_blocks: int
    block_bytes: int  # all layers' pages of one block
    layers: tuple[LayerPages, ...]

    def ranges(self, block_ids: list[int]) -> list[Range]:
        """The byte ranges of these blocks across every layer: one per run of
        adjacent blocks per layer where a layer's blocks are contiguous (a few
        dozen tuples for thousands of free blocks, not one per block)."""
        runs = block_runs(block_ids)
        out: list[Range] = []
        for layer in self.layers:
            stride, first = layer.block_stride, layer.first
            if stride == layer.page:
                out += [(first + b * stride, first + (b + n) * stride) for b, n in runs]
            else:
                starts = (first + (b + i) * stride for b, n in runs for i in range(n))
                out += [(start, start + layer.page) for start in starts]
        return out


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """(first block, count) for each run of adjacent ids, duplicates dropped."""
    ids = np.unique(np.asarray(block_ids, dtype=np.int64))
    if len(ids) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(ids)]))
    return [(int(ids[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)]


def build_l1_page_map(kv_cache_config, base_address: int) -> L1PageMap | None:
    """The page map of vLLM's backing allocation starting at ``base_address``;
    None where a block's page is not one run of bytes in each layer (a
    layout with heads outside blocks, block_stride < page: a range would
    cover other blocks' bytes). vLLM 0.32's CPU layouts all qualify."""
    layers: list[LayerPages] = []
    specs = {}
    for group in kv_cache_config.kv_cache_groups:
        for name in group.layer_names:
            spec = group.kv_cache_spec
            inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
            specs[name] = inner[name] if inner else spec
    for tensor in kv_cache_config.kv_cache_tensors:
        for index, name in enumerate(tensor.layers):
            layers.append(
                LayerPages(
                    first=base_address + tensor.offset + index * tensor.layer_stride,
                    block_stride=tensor.block_stride,
                    page=specs[name].page_size_bytes,
                )
            )
    # Cache groups overlay each other (a block id is owned by one group at a
    # time): layers of different groups at the same place are the same bytes,
    # counted once (Gemma 3: 18 layers in 6 groups are 3 regions).
    layers = list(dict.fromkeys(layers))
    if any(layer.block_stride < layer.page for layer in layers):
        return None
    return L1PageMap(
        num_blocks=kv_cache_config.num_blocks,
        block_bytes=sum(layer.page for layer in layers),
        layers=tuple(layers),
    )


class L1PageRegistry:
    """One engine's L1 page map, set by the worker, read by the release thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._map: L1PageMap | None = None

    def set(self, page_map: L1PageMap | None) -> None:
        with self._lock:
            self._map = page_map

    def get(self) -> L1PageMap | None:
        with self._lock:
            return self._map

    @contextlib.contextmanager
    def held(self) -> Iterator[L1PageMap | None]:
        """The map, valid until the block ends: ``close`` waits for it."""
        with self._lock:
            yield self._map

    def close(self) -> None:
        """The KV cache is about to be freed: no pass may touch it any more."""
        with self._lock:
            self._map = None
