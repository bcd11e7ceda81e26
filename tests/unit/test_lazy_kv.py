"""LazyZerosMode against vLLM's own KV-cache allocation.

lazy_kv.py claims that skipping the memset changes only the buffer's contents:
vLLM's ``allocate_kv_cache`` must build the same per-layer views (the same
bytes of a same-sized buffer) with and without the mode. The configs come from
vLLM's ``get_kv_cache_config_from_groups``, so the strides are vLLM's, not ours.
"""

from __future__ import annotations

import contextlib
import gc
from types import SimpleNamespace

import psutil
import pytest
import torch
from vllm.v1.core.kv_cache_utils import (
    _get_kv_cache_groups_uniform_page_size,
    create_kv_cache_group_specs,
    get_kv_cache_config_from_groups,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

from vllm_uma.plugin.lazy_kv import LazyZerosMode

MiB = 1 << 20
L = KVCacheLayout


def _config(
    specs: dict[str, FullAttentionSpec],
    groups: list[list[str]],
    layout: KVCacheLayout,
    available: int = 4 * MiB,
) -> KVCacheConfig:
    # Only what get_kv_cache_config_from_groups reads on the non-HiSparse path.
    vllm_config = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(
            prefix_cache_retention_interval=None,
            num_gpu_blocks_override=None,
            get_resolved_kv_cache_layout=lambda: layout,
        ),
    )
    kv_groups = create_kv_cache_group_specs(specs, groups)
    return get_kv_cache_config_from_groups(vllm_config, kv_groups, available)


def _spec(block_size: int, num_kv_heads: int, head_size: int, dtype) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype
    )


def _allocate(config, layout, lazy: bool, kernel_block_sizes=None):
    mode = LazyZerosMode() if lazy else contextlib.nullcontext()
    with mode:
        caches = allocate_kv_cache(config, torch.device("cpu"), layout, kernel_block_sizes)
    return caches, mode


def _geometry(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    return (
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t.data_ptr() - storage.data_ptr(),
        storage.nbytes(),
    )


def _byte_masks(caches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # The bytes of the backing buffer each layer's view can address. C is the
    # innermost dim in every layout, so a uint8 view is legal and its strides
    # and offset are in bytes.
    masks = {}
    for name, t in caches.items():
        b = t.view(torch.uint8)
        masks[name] = torch.zeros(t.untyped_storage().nbytes(), dtype=torch.bool)
        torch.as_strided(masks[name], b.shape, b.stride(), b.storage_offset()).fill_(True)
    return masks


def _aliases(masks: dict[str, torch.Tensor]) -> set[tuple[str, str]]:
    names = sorted(masks)
    return {
        (a, b) for i, a in enumerate(names) for b in names[i + 1 :] if (masks[a] & masks[b]).any()
    }


def _assert_same_views(config, layout, kernel_block_sizes=None) -> set[tuple[str, str]]:
    """Allocates both ways, asserts identical views; returns the alias pairs."""
    zeroed, _ = _allocate(config, layout, False, kernel_block_sizes)
    lazy, mode = _allocate(config, layout, True, kernel_block_sizes)
    # Else a mode that never fires would pass every comparison below.
    assert mode.intercepted_bytes == config.kv_cache_tensors[0].size
    assert sorted(lazy) == sorted(zeroed)
    for name in zeroed:
        assert _geometry(lazy[name]) == _geometry(zeroed[name]), name
    assert len({t.untyped_storage().data_ptr() for t in lazy.values()}) == 1
    lazy_masks, zeroed_masks = _byte_masks(lazy), _byte_masks(zeroed)
    for name in zeroed:
        assert torch.equal(lazy_masks[name], zeroed_masks[name]), name
    assert _aliases(lazy_masks) == _aliases(zeroed_masks)
    return _aliases(zeroed_masks)


# The KV cache sees only num_kv_heads: MHA keeps all 8 query heads, GQA fewer,
# MQA one. A uniform single-group model passes validate_kv_cache_layout in
# every layout, so all six are covered.
@pytest.mark.parametrize("layout", list(L), ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_lazy_views_match_zeroed(num_kv_heads, block_size, dtype, layout):
    names = [f"layers.{i}.attn" for i in range(3)]
    spec = _spec(block_size, num_kv_heads, 32, dtype)
    config = _config(dict.fromkeys(names, spec), [names], layout)
    assert config.num_blocks >= 2
    assert not config.needs_kv_cache_zeroing  # uniform precision: allocated lazily
    assert _assert_same_views(config, layout) == set()  # layers own disjoint bytes


def test_lazy_views_match_zeroed_with_kernel_block_split():
    # The CPU backend's layout (LBHNC only) with 128-token blocks viewed as
    # 32-token kernel blocks, as the real worker passes kernel_block_sizes.
    names = ["layers.0.attn", "layers.1.attn"]
    spec = _spec(128, 2, 64, torch.bfloat16)
    config = _config(dict.fromkeys(names, spec), [names], L.LBHNC)
    caches, _ = _allocate(config, L.LBHNC, True, [32])
    assert caches[names[0]].shape[0] == 4 * config.num_blocks  # the split happened
    _assert_same_views(config, L.LBHNC, [32])


def test_lazy_views_match_zeroed_for_a_sliding_window_hybrid():
    """Gemma 3's layout: 18 layers, every sixth full attention, the others a
    512-token sliding window; vLLM groups them (its own grouping function)
    into six groups of three layers that overlay one set of blocks. The
    lazy allocation must give each layer the same bytes, and a layer
    shares its bytes only with the same position in the other groups."""
    kw = dict(block_size=128, num_kv_heads=1, head_size=256, dtype=torch.bfloat16)
    specs = {
        f"layers.{i}.attn": (
            FullAttentionSpec(**kw) if i % 6 == 5 else SlidingWindowSpec(sliding_window=512, **kw)
        )
        for i in range(18)
    }
    groups = _get_kv_cache_groups_uniform_page_size(specs)
    assert len(groups) == 6 and all(len(g.layer_names) == 3 for g in groups)
    config = _config(specs, [g.layer_names for g in groups], L.LBHNC)
    assert not config.needs_kv_cache_zeroing  # one dtype: allocated lazily
    aliases = _assert_same_views(config, L.LBHNC)
    # Position k of every group is one region: 6 layers, 15 pairs each.
    position = {name: k for g in groups for k, name in enumerate(g.layer_names)}
    assert aliases == {(a, b) for a, b in _pairs(position) if position[a] == position[b]}
    assert len(aliases) == 3 * 15


def _pairs(position: dict[str, int]) -> list[tuple[str, str]]:
    names = sorted(position)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


# Two groups, bf16 then fp32. vLLM overlays groups from byte 0, so a block can
# be reread under the other dtype: that is why vLLM asks for zeroing. With fp32
# head 32 the pages are equal; with head 64 they differ, which only the
# block-outermost, block-compact layouts (BL..) can express.
@pytest.mark.parametrize(
    "layout,fp32_head,expected",
    [
        (L.LBHNC, 32, {("l0", "l2"), ("l1", "l3")}),
        (L.BLHNC, 32, {("l0", "l2"), ("l1", "l3")}),
        (L.BLHNC, 64, {("l0", "l2"), ("l1", "l2")}),
    ],
    ids=["LBHNC-same-page", "BLHNC-same-page", "BLHNC-mixed-page"],
)
def test_mixed_precision_needs_zeroing_and_keeps_aliasing(layout, fp32_head, expected):
    specs = {
        **dict.fromkeys(["l0", "l1"], _spec(16, 2, 64, torch.bfloat16)),
        **dict.fromkeys(["l2", "l3"], _spec(16, 2, fp32_head, torch.float32)),
    }
    config = _config(specs, [["l0", "l1"], ["l2", "l3"]], layout)
    assert config.needs_kv_cache_zeroing
    assert _assert_same_views(config, layout) == expected


def test_worker_zeroes_only_when_vllm_asks(monkeypatch):
    # UmaWorker's own decision, with its vLLM parents stubbed: a uniform cache
    # gets the lazy context, a mixed-precision one vLLM's context untouched.
    from vllm.v1.worker.gpu_worker import Worker

    from vllm_uma.plugin.uma_settings import UmaSettings
    from vllm_uma.plugin.worker import UmaWorker, WiringResult

    base = contextlib.nullcontext()
    monkeypatch.setattr(Worker, "initialize_from_config", lambda self, config: None)
    monkeypatch.setattr(Worker, "_maybe_get_memory_pool_context", lambda self, tag: base)
    worker = object.__new__(UmaWorker)
    worker.budget, worker.weights_bytes, worker.wiring = None, 0, WiringResult(0, None)
    worker.uma_settings = UmaSettings()
    worker.settings = SimpleNamespace(uma=worker.uma_settings, offload=None)  # no offloading
    # What the breakdown's group-aware capacity reads (two groups below).
    worker.vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=64),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )
    worker.initialize_from_config(
        _config(
            {"a": _spec(16, 2, 64, torch.bfloat16), "b": _spec(16, 2, 32, torch.float32)},
            [["a"], ["b"]],
            L.LBHNC,
        )
    )
    assert worker._maybe_get_memory_pool_context("kv_cache") is base
    worker.initialize_from_config(
        _config({"a": _spec(16, 2, 32, torch.bfloat16)}, [["a"]], L.LBHNC)
    )
    with worker._maybe_get_memory_pool_context("kv_cache"):
        stack = torch.overrides._get_current_function_mode_stack()
        assert any(isinstance(m, LazyZerosMode) for m in stack)


def _rss_growth(config, layout, lazy: bool) -> int:
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    caches, _ = _allocate(config, layout, lazy)
    grown = process.memory_info().rss - before
    del caches  # freed (munmap) before the next measurement
    gc.collect()
    return grown


def test_lazy_allocation_does_not_commit_pages():
    names = [f"layers.{i}.attn" for i in range(4)]
    spec = _spec(16, 8, 64, torch.bfloat16)
    config = _config(dict.fromkeys(names, spec), [names], L.LBHNC, available=512 * MiB)
    size = config.kv_cache_tensors[0].size
    assert size > 500 * MiB
    lazy = _rss_growth(config, L.LBHNC, lazy=True)
    zeroed = _rss_growth(config, L.LBHNC, lazy=False)
    assert lazy < 0.1 * size, f"lazy: {lazy / MiB:.0f} MiB of {size / MiB:.0f} resident"
    assert zeroed > 0.5 * size, f"zeroed: only {zeroed / MiB:.0f} MiB resident"


@pytest.fixture
def poisoned_empty(monkeypatch):
    # Deterministic mode fills uninitialised memory with NaN / int max, so a
    # zeros() that skipped its memset is caught every time, not only when the
    # allocator happens to hand back a dirty chunk.
    monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory", True)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def test_mode_only_rewrites_zeros(poisoned_empty):
    like = torch.ones(16, dtype=torch.int32)
    with LazyZerosMode() as mode:
        assert bool((torch.ones(16) == 1).all())
        assert bool((torch.full((16,), 7, dtype=torch.int32) == 7).all())
        assert not torch.zeros_like(like).any()
        empty = torch.empty(3, 5, dtype=torch.float16)
        assert empty.shape == (3, 5) and bool(empty.isnan().all())
        lazy = torch.zeros(2, 3, dtype=torch.bfloat16, requires_grad=True)
        assert lazy.shape == (2, 3) and lazy.dtype == torch.bfloat16 and lazy.requires_grad
        assert bool(lazy.isnan().all())  # it really was torch.empty
    assert mode.intercepted_bytes == 2 * 3 * 2  # only the one torch.zeros
    assert not torch.zeros(16, dtype=torch.int32).any()  # outside the mode: zeroed


def test_intercepted_bytes_counts_each_zeros_call():
    with LazyZerosMode() as mode:
        torch.zeros(1000)  # float32
        torch.zeros((2, 3), dtype=torch.bfloat16)
        torch.zeros(size=(5,), dtype=torch.int8)
        torch.ones(1000)
    assert mode.intercepted_bytes == 4000 + 12 + 5
