"""LazyZerosMode against vLLM's own KV-cache allocation.

The claim in lazy_kv.py is that skipping the memset changes nothing but the
buffer's contents: vLLM's ``allocate_kv_cache`` must build the same per-layer
views (same bytes of the same-sized buffer) with and without the mode. The
configs come from vLLM's ``get_kv_cache_config_from_groups`` so the strides are
vLLM's, not ours.
"""

from __future__ import annotations

import contextlib
import gc
from types import SimpleNamespace

import psutil
import pytest
import torch
from vllm.v1.core.kv_cache_utils import (
    create_kv_cache_group_specs,
    get_kv_cache_config_from_groups,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

from vllm_uma.lazy_kv import LazyZerosMode

MiB = 1 << 20
CPU = torch.device("cpu")


def _config(groups: dict[str, FullAttentionSpec], names: list[list[str]],
            layout: KVCacheLayout, available: int = 4 * MiB) -> KVCacheConfig:
    # Only the attributes get_kv_cache_config_from_groups reads (non-HiSparse path).
    vllm_config = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(
            prefix_cache_retention_interval=None,
            num_gpu_blocks_override=None,
            get_resolved_kv_cache_layout=lambda: layout,
        ),
    )
    kv_groups = create_kv_cache_group_specs(groups, names)
    return get_kv_cache_config_from_groups(vllm_config, kv_groups, available)


def _spec(block_size: int, num_kv_heads: int, head_size: int, dtype) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype
    )


def _allocate(config, layout, lazy: bool, kernel_block_sizes=None):
    mode = LazyZerosMode() if lazy else contextlib.nullcontext()
    with mode:
        caches = allocate_kv_cache(config, CPU, layout, kernel_block_sizes)
    return caches, mode


def _geometry(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype,
            t.data_ptr() - storage.data_ptr(), storage.nbytes())


def _byte_masks(caches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Which bytes of the backing buffer each layer's view can address. The
    # content dim C is innermost in every layout, so a uint8 view is legal and
    # its strides/offset are in bytes.
    masks = {}
    for name, t in caches.items():
        b = t.view(torch.uint8)
        mask = torch.zeros(t.untyped_storage().nbytes(), dtype=torch.uint8)
        torch.as_strided(mask, b.shape, b.stride(), b.storage_offset()).fill_(1)
        masks[name] = mask.bool()
    return masks


def _aliases(masks: dict[str, torch.Tensor]) -> set[tuple[str, str]]:
    names = sorted(masks)
    return {(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if (masks[a] & masks[b]).any()}


def _assert_same_views(config, layout, kernel_block_sizes=None) -> set[tuple[str, str]]:
    """Allocates both ways, asserts identical views; returns the alias pairs."""
    zeroed, _ = _allocate(config, layout, lazy=False, kernel_block_sizes=kernel_block_sizes)
    lazy, mode = _allocate(config, layout, lazy=True, kernel_block_sizes=kernel_block_sizes)
    # Without this the comparison would pass for a mode that never fires.
    assert mode.intercepted_bytes == config.kv_cache_tensors[0].size
    assert all(not t.any() for t in zeroed.values())  # the reference really is zeroed
    assert sorted(lazy) == sorted(zeroed)
    for name in zeroed:
        assert _geometry(lazy[name]) == _geometry(zeroed[name]), name
    # Every layer shares one backing buffer in both allocations.
    assert len({t.untyped_storage().data_ptr() for t in lazy.values()}) == 1
    lazy_masks, zeroed_masks = _byte_masks(lazy), _byte_masks(zeroed)
    for name in zeroed:
        assert torch.equal(lazy_masks[name], zeroed_masks[name]), name
    assert _aliases(lazy_masks) == _aliases(zeroed_masks)
    return _aliases(zeroed_masks)


# The KV cache sees only num_kv_heads: MHA has as many as query heads (8 here),
# GQA fewer, MQA one.
@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda m: m.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_lazy_views_match_zeroed(num_kv_heads, block_size, dtype, layout):
    names = [f"layers.{i}.attn" for i in range(3)]
    spec = _spec(block_size, num_kv_heads, 32, dtype)
    config = _config(dict.fromkeys(names, spec), [names], layout)
    assert config.num_blocks >= 2
    # Uniform precision: the worker allocates lazily.
    assert not config.needs_kv_cache_zeroing
    assert _assert_same_views(config, layout) == set()  # layers own disjoint bytes


def test_lazy_views_match_zeroed_with_kernel_block_split():
    # The CPU backend's layout, with 128-token manager blocks viewed as
    # 32-token kernel blocks, as the worker passes kernel_block_sizes.
    layout = KVCacheLayout.LBHNC
    names = ["layers.0.attn", "layers.1.attn"]
    config = _config(dict.fromkeys(names, _spec(128, 2, 64, torch.bfloat16)), [names], layout)
    caches = _allocate(config, layout, lazy=True, kernel_block_sizes=[32])[0]
    assert caches[names[0]].shape[0] == 4 * config.num_blocks
    _assert_same_views(config, layout, kernel_block_sizes=[32])


@pytest.mark.parametrize("layout", [KVCacheLayout.LBHNC, KVCacheLayout.BLHNC],
                         ids=lambda m: m.name)
def test_mixed_precision_needs_zeroing_and_aliases(layout):
    # Two groups, bf16 and fp32, with equal page sizes (bf16 x 64 == fp32 x 32):
    # vLLM overlays the groups from byte 0, so a block can be reread under the
    # other dtype, which is why vLLM asks for zeroing here.
    g0, g1 = ["layers.0.attn", "layers.1.attn"], ["layers.2.attn", "layers.3.attn"]
    specs = {**dict.fromkeys(g0, _spec(16, 2, 64, torch.bfloat16)),
             **dict.fromkeys(g1, _spec(16, 2, 32, torch.float32))}
    config = _config(specs, [g0, g1], layout)
    assert config.needs_kv_cache_zeroing
    # The views would still match; the aliasing across groups must survive.
    aliases = _assert_same_views(config, layout)
    assert {("layers.0.attn", "layers.2.attn"), ("layers.1.attn", "layers.3.attn")} <= aliases


def test_worker_zeroes_only_when_vllm_asks(monkeypatch):
    # UmaWorker's own decision, with the vLLM parents stubbed out: a uniform
    # cache gets the lazy context, a mixed-precision one vLLM's plain context.
    from vllm.v1.worker.gpu_worker import Worker

    from vllm_uma.worker import UmaWorker, WiringResult

    base = contextlib.nullcontext()
    monkeypatch.setattr(Worker, "initialize_from_config", lambda self, config: None)
    monkeypatch.setattr(Worker, "_maybe_get_memory_pool_context", lambda self, tag: base)
    worker = object.__new__(UmaWorker)
    worker.budget, worker.weights_bytes, worker.wiring = None, 0, WiringResult(0, None)
    layout = KVCacheLayout.LBHNC
    uniform = _config({"a": _spec(16, 2, 32, torch.bfloat16)}, [["a"]], layout)
    mixed = _config({"a": _spec(16, 2, 64, torch.bfloat16),
                     "b": _spec(16, 2, 32, torch.float32)}, [["a"], ["b"]], layout)
    worker.initialize_from_config(mixed)
    assert worker._maybe_get_memory_pool_context("kv_cache") is base
    worker.initialize_from_config(uniform)
    with worker._maybe_get_memory_pool_context("kv_cache"):
        stack = torch.overrides._get_current_function_mode_stack()
        assert any(isinstance(m, LazyZerosMode) for m in stack)


def _rss_growth(config, layout, lazy: bool) -> int:
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    caches, _ = _allocate(config, layout, lazy)
    grown = process.memory_info().rss - before
    del caches  # freed before the next measurement
    gc.collect()
    return grown


def test_lazy_allocation_does_not_commit_pages():
    layout = KVCacheLayout.LBHNC
    names = [f"layers.{i}.attn" for i in range(4)]
    config = _config(dict.fromkeys(names, _spec(16, 8, 64, torch.bfloat16)), [names],
                     layout, available=512 * MiB)
    size = config.kv_cache_tensors[0].size
    assert size > 500 * MiB
    lazy = _rss_growth(config, layout, lazy=True)
    zeroed = _rss_growth(config, layout, lazy=False)
    assert lazy < 0.1 * size, f"lazy allocation made {lazy / MiB:.0f} MiB resident"
    assert zeroed > 0.5 * size, f"zeroed allocation made only {zeroed / MiB:.0f} MiB resident"


@pytest.fixture
def poisoned_empty(monkeypatch):
    # In deterministic mode torch fills uninitialised memory with NaN / int
    # max, so a zeros() that skipped its memset is caught every time, without
    # relying on the allocator handing back a dirty chunk.
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
