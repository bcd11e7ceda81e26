"""The L1 page map (vllm_uma/memory_release/l1_pages.py) against vLLM's own allocation.

The configs come from vLLM's ``get_kv_cache_config_from_groups`` and the
per-layer views from its ``allocate_kv_cache``, so the claim checked is
exact: the ranges the map gives for block b are the bytes of block b in
every layer's view, nothing more, nothing less.

Only the block-compact layouts are checked (a block's page is one run of
bytes in each layer): the CPU attention backend offers LBHNC alone, and the
map assumes such a layout.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

from tests.unit.test_lazy_kv import _config as build_kv_config
from vllm_uma.memory_release.l1_pages import L1PageRegistry, build_l1_page_map
from vllm_uma.memory_release.pages import merge

L = KVCacheLayout
MiB = 1 << 20
BLOCK_COMPACT = [L.LBHNC, L.LBNHC, L.BLHNC, L.BLNHC]


# vLLM's own KVCacheConfig for these specs (the lazy-KV tests' builder).
kv_config = functools.partial(build_kv_config, available=MiB)


def spec(block_size: int, heads: int, head_size: int, dtype) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype
    )


def dense_span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes ``t`` addresses; they must be one dense run."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    start = t.data_ptr()
    end = start + (last + 1) * t.element_size()
    assert end - start == t.numel() * t.element_size(), "the block's bytes have holes"
    return start, end


def allocate(config: KVCacheConfig, layout, kernel_block_sizes=None):
    caches = allocate_kv_cache(config, torch.device("cpu"), layout, kernel_block_sizes)
    base = next(iter(caches.values())).untyped_storage().data_ptr()
    return caches, build_l1_page_map(config, base)


def layer_order(config: KVCacheConfig) -> list[str]:
    return [name for tensor in config.kv_cache_tensors for name in tensor.layers]


@pytest.mark.parametrize("layout", BLOCK_COMPACT, ids=lambda m: m.name)
def test_each_blocks_ranges_are_its_bytes_in_every_layer_view(layout):
    names = [f"layers.{i}.attn" for i in range(3)]
    s = spec(16, 2, 32, torch.bfloat16)
    config = kv_config(dict.fromkeys(names, s), [names], layout)
    caches, page_map = allocate(config, layout)
    assert config.num_blocks == 85  # 1 MiB / (3 layers x 4 KiB: 16 x 2 x 32 x K,V x 2 B)
    assert page_map.num_blocks == config.num_blocks
    assert page_map.block_bytes == 3 * s.page_size_bytes == 3 * 4096
    for b in range(config.num_blocks):
        expected = [dense_span(caches[name][b]) for name in layer_order(config)]
        assert page_map.ranges([b]) == expected, b


def test_a_run_of_blocks_is_one_range_per_layer_when_layers_are_outermost():
    names = ["a", "b", "c"]
    config = kv_config(dict.fromkeys(names, spec(16, 2, 32, torch.bfloat16)), [names], L.LBHNC)
    caches, page_map = allocate(config, L.LBHNC)
    runs = merge(page_map.ranges([5, 3, 4]))
    assert runs == [(dense_span(caches[n][3])[0], dense_span(caches[n][5])[1]) for n in names]


def test_a_run_of_blocks_is_one_range_when_blocks_are_outermost():
    names = ["a", "b", "c"]
    config = kv_config(dict.fromkeys(names, spec(16, 2, 32, torch.bfloat16)), [names], L.BLHNC)
    caches, page_map = allocate(config, L.BLHNC)
    assert merge(page_map.ranges([5, 3, 4])) == [
        (dense_span(caches["a"][3])[0], dense_span(caches["c"][5])[1])
    ]


def test_kernel_block_split_views_cover_the_same_bytes():
    # The CPU backend views a 128-token block as 32-token kernel blocks, as
    # the real worker passes kernel_block_sizes: block b is rows 4b..4b+3.
    names = ["layers.0.attn", "layers.1.attn"]
    config = kv_config(dict.fromkeys(names, spec(128, 2, 64, torch.bfloat16)), [names], L.LBHNC)
    caches, page_map = allocate(config, L.LBHNC, [32])
    assert caches[names[0]].shape[0] == 4 * config.num_blocks
    for b in range(config.num_blocks):
        expected = [dense_span(caches[n][4 * b : 4 * b + 4]) for n in names]
        assert page_map.ranges([b]) == expected, b


@pytest.mark.parametrize("layout", [L.LBHNC, L.BLHNC], ids=lambda m: m.name)
def test_two_groups_of_different_pages_each_give_their_own_page_size(layout):
    # bf16 and fp32 groups overlay each other from byte 0 (a block id is
    # owned by one group at a time): block b's ranges cover both groups'
    # views, and bytes both groups address are counted once.
    specs = {
        **dict.fromkeys(["l0", "l1"], spec(16, 2, 64, torch.bfloat16)),
        **dict.fromkeys(["l2", "l3"], spec(16, 2, 32, torch.float32)),
    }
    config = kv_config(specs, [["l0", "l1"], ["l2", "l3"]], layout)
    caches, page_map = allocate(config, layout)
    assert len(config.kv_cache_tensors) == 2
    first_block = list(dict.fromkeys(dense_span(caches[n][0]) for n in layer_order(config)))
    assert page_map.block_bytes == sum(end - start for start, end in first_block)
    for b in range(config.num_blocks):
        expected = list(dict.fromkeys(dense_span(caches[n][b]) for n in layer_order(config)))
        assert page_map.ranges([b]) == expected, b


@pytest.mark.parametrize("layout", [L.LBHNC, L.BLHNC], ids=lambda m: m.name)
def test_a_tensors_offset_moves_its_layers(layout):
    # vLLM's configs here put every tensor at offset 0; the same placement
    # split into one tensor per layer puts layer l at offset l * layer_stride.
    names = ["a", "b", "c"]
    config = kv_config(dict.fromkeys(names, spec(16, 2, 32, torch.bfloat16)), [names], layout)
    (whole,) = config.kv_cache_tensors
    split = [
        dataclasses.replace(whole, layers=[name], offset=i * whole.layer_stride)
        for i, name in enumerate(names)
    ]
    config = dataclasses.replace(config, kv_cache_tensors=split)
    caches, page_map = allocate(config, layout)
    assert [layer.first - page_map.layers[0].first for layer in page_map.layers] == [
        0,
        whole.layer_stride,
        2 * whole.layer_stride,
    ]
    for b in range(config.num_blocks):
        assert page_map.ranges([b]) == [dense_span(caches[n][b]) for n in names], b


def test_the_registry_holds_one_map_and_can_be_cleared():
    config = kv_config({"a": spec(16, 1, 32, torch.bfloat16)}, [["a"]], L.LBHNC)
    page_map = build_l1_page_map(config, 1 << 20)
    assert page_map.layers[0].first == 1 << 20
    registry = L1PageRegistry()
    assert registry.get() is None
    registry.set(page_map)
    assert registry.get() is page_map
    registry.set(None)
    assert registry.get() is None


def test_no_map_where_a_blocks_page_is_not_one_run_of_bytes():
    # Heads outside blocks (LHBNC-like): block b's bytes in a layer are
    # spread, block_stride < page; a range per block would cover others'.
    spec = SimpleNamespace(page_size_bytes=4096)
    group = SimpleNamespace(layer_names=["a"], kv_cache_spec=spec)
    tensor = SimpleNamespace(layers=["a"], offset=0, layer_stride=1 << 20, block_stride=1024)
    config = SimpleNamespace(kv_cache_groups=[group], kv_cache_tensors=[tensor], num_blocks=8)
    assert build_l1_page_map(config, base_address=1 << 30) is None
    tensor.block_stride = 4096
    assert build_l1_page_map(config, base_address=1 << 30).ranges([2]) == [
        ((1 << 30) + 8192, (1 << 30) + 12288)
    ]


def test_runs_of_adjacent_blocks_are_one_range_per_layer():
    # Layer-outermost: 3,000 free blocks in two runs are two ranges a layer,
    # whatever their order or repeats (the release asks for thousands).
    spec = SimpleNamespace(page_size_bytes=4096)
    group = SimpleNamespace(layer_names=["a", "b"], kv_cache_spec=spec)
    tensor = SimpleNamespace(
        layers=["a", "b"], offset=0, layer_stride=4096 * 4000, block_stride=4096
    )
    config = SimpleNamespace(kv_cache_groups=[group], kv_cache_tensors=[tensor], num_blocks=4000)
    page_map = build_l1_page_map(config, base_address=0)
    ids = [*range(2000, 3000), *reversed(range(10, 2010)), 12]
    layer_b = 4096 * 4000
    assert page_map.ranges(ids) == [
        (10 * 4096, 3000 * 4096),
        (layer_b + 10 * 4096, layer_b + 3000 * 4096),
    ]
    assert page_map.ranges([7, 9]) == [
        (7 * 4096, 8 * 4096),
        (9 * 4096, 10 * 4096),
        (layer_b + 7 * 4096, layer_b + 8 * 4096),
        (layer_b + 9 * 4096, layer_b + 10 * 4096),
    ]
    assert page_map.ranges([]) == []


def test_groups_that_overlay_the_same_bytes_count_them_once():
    # Two groups of two layers at the same places (a hybrid model's sliding
    # and full groups): one block is two layers' pages, not four.
    spec = SimpleNamespace(page_size_bytes=4096)
    groups = [
        SimpleNamespace(layer_names=["s0", "s1"], kv_cache_spec=spec),
        SimpleNamespace(layer_names=["f0", "f1"], kv_cache_spec=spec),
    ]
    tensors = [
        SimpleNamespace(layers=names, offset=0, layer_stride=4096 * 8, block_stride=4096)
        for names in (["s0", "s1"], ["f0", "f1"])
    ]
    config = SimpleNamespace(kv_cache_groups=groups, kv_cache_tensors=tensors, num_blocks=8)
    page_map = build_l1_page_map(config, base_address=0)
    assert page_map.block_bytes == 2 * 4096
    assert page_map.ranges([3]) == [(3 * 4096, 4 * 4096), (11 * 4096, 12 * 4096)]
