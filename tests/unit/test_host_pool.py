"""L2 host pool and the L1 <-> L2 mover (vllm_uma/kv_offload/), on tiny tensors."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.base import CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_uma.kv_offload import mover as mover_module
from vllm_uma.kv_offload.host_pool import HostPool, SharedPool
from vllm_uma.kv_offload.mover import (
    HostPoolMover,
    LayoutError,
    consecutive_spans,
    split_views,
)

NUM_BLOCKS, PAGE, LAYERS = 8, 64, 3


def test_numpy_and_torch_views_are_the_same_bytes():
    pool = HostPool(4, 128)
    assert pool.array.ctypes.data == pool.tensor.data_ptr()
    pool.array[2, 5] = 77
    assert pool.tensor[2, 5].item() == 77
    pool.tensor[3, 0] = 9
    assert pool.array[3, 0] == 9
    pool.close()


def test_an_empty_pool_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="--kv-offloading-size is too small"):
        HostPool(0, 128)


def kv_caches(
    fill: bool, backing: str | None = None
) -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    """Per-layer KV tensors: not at one stride (``backing`` None: layer l at
    l(l+1)/2 layer sizes, so that the distances grow) or views of one buffer
    as vLLM allocates it, ``"layer_major"`` (layer l at l * NUM_BLOCKS *
    PAGE) or ``"block_major"`` (block b's pages of every layer side by side)."""
    if backing is None:
        # Not separate torch.zeros: the allocator may place those at one
        # stride by chance, and the mover then rightly copies them as one.
        size = NUM_BLOCKS * PAGE
        buf = torch.zeros(size * LAYERS * (LAYERS + 1) // 2, dtype=torch.int8)
        starts = [size * layer * (layer + 1) // 2 for layer in range(LAYERS)]
        layers = [buf[s : s + size].view(NUM_BLOCKS, PAGE) for s in starts]
    else:
        buf = torch.zeros(NUM_BLOCKS * LAYERS * PAGE, dtype=torch.int8)
        if backing == "layer_major":
            layers = [buf.view(LAYERS, NUM_BLOCKS, PAGE)[i] for i in range(LAYERS)]
        else:
            layers = [buf.view(NUM_BLOCKS, LAYERS, PAGE)[:, i] for i in range(LAYERS)]
    for layer, t in enumerate(layers):
        if fill:
            t.copy_(torch.randint(-128, 127, (NUM_BLOCKS, PAGE), dtype=torch.int8))
            t[:, 0] = layer  # tell the layers apart
    tensors = [CanonicalKVCacheTensor(tensor=t, page_size_bytes=PAGE) for t in layers]
    return CanonicalKVCaches(tensors=tensors, group_data_refs=[[]]), layers


def l1(ids):
    return GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("backing", [None, "layer_major", "block_major"])
def test_store_then_load_restores_exact_bytes_into_other_blocks(backing, threads, monkeypatch):
    # Every job split across the threads, however small (5 > LAYERS: capped).
    monkeypatch.setattr(mover_module, "SPLIT_MIN_BYTES", 0)
    caches, layers = kv_caches(fill=True, backing=backing)
    original = [t.clone() for t in layers]
    mover = HostPoolMover(caches, HostPool(6, LAYERS * PAGE + 64), copy_threads=threads)
    # Layers in one buffer are copied a block (every layer) at a time.
    assert len(mover.views) == (LAYERS if backing is None else 1)
    assert len(mover.parts) == min(threads, LAYERS)
    mover.submit_store(1, l1([1, 4, 6]), CPULoadStoreSpec([5, 0, 2]))
    mover.wait({1})
    for t in layers:
        t.zero_()  # L1 forgets: the blocks were evicted and reused
    mover.submit_load(2, CPULoadStoreSpec([0, 2, 5]), l1([7, 3, 2]))
    mover.wait({2})
    for before, after in zip(original, layers, strict=True):
        # row 0 held block 4, row 2 block 6, row 5 block 1
        assert torch.equal(after[7], before[4])
        assert torch.equal(after[3], before[6])
        assert torch.equal(after[2], before[1])
        assert not after[[0, 1, 4, 5, 6]].any()
    results = {r.job_id: r for r in mover.get_finished()}
    assert set(results) == {1, 2}
    assert all(r.success for r in results.values())
    assert results[1].transfer_size == 3 * LAYERS * PAGE
    assert mover.get_finished() == []  # reported once
    mover.shutdown()


@pytest.mark.parametrize("backing", [None, "layer_major"])
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_split_views_cover_every_byte_once(backing, threads):
    caches, layers = kv_caches(fill=False, backing=backing)
    mover = HostPoolMover(caches, HostPool(NUM_BLOCKS, LAYERS * PAGE))
    parts = split_views(mover.views, threads)
    assert 1 <= len(parts) <= threads
    for part in parts:
        for l1_view, pool_view in part:
            l1_view[...] += 1  # each part counts the bytes it copies
            pool_view[...] += 1
    # Every byte of L1 and of the pool rows is in exactly one part.
    assert all(bool((t == 1).all()) for t in layers)
    assert bool((mover.pool.array == 1).all())
    sizes = [sum(v[0][:, 0].size for v in part) for part in parts]
    assert max(sizes) - min(sizes) <= NUM_BLOCKS
    mover.shutdown()
    with pytest.raises(ValueError, match="copy_threads=0"):
        split_views(mover.views, 0)


def test_a_failed_part_fails_the_job_after_every_part_stopped(monkeypatch):
    monkeypatch.setattr(mover_module, "SPLIT_MIN_BYTES", 0)
    caches, _ = kv_caches(fill=True, backing="layer_major")
    mover = HostPoolMover(caches, HostPool(4, LAYERS * PAGE), copy_threads=3)
    copied = []
    real = mover_module._load_part

    def load_part(part, spans):
        if part is not mover.parts[0]:
            raise OSError("helper copy failed")
        real(part, spans)
        copied.append(part)

    monkeypatch.setattr(mover_module, "_load_part", load_part)
    mover.submit_load(1, CPULoadStoreSpec([0, 1]), l1([2, 3]))
    with pytest.raises(OSError, match="helper copy failed"):
        mover.wait({1})
    assert copied == [mover.parts[0]]
    mover.shutdown()


def test_layers_not_at_one_stride_are_copied_one_by_one():
    buf = torch.zeros(4 * NUM_BLOCKS * PAGE, dtype=torch.int8).view(4, NUM_BLOCKS, PAGE)
    gap = [buf[0], buf[1], buf[3]]  # layer 2 sits two layers after layer 1
    overlap = [buf[0], buf[0]]  # two groups over the same bytes
    for layers in (gap, overlap):
        tensors = [CanonicalKVCacheTensor(tensor=t, page_size_bytes=PAGE) for t in layers]
        caches = CanonicalKVCaches(tensors=tensors, group_data_refs=[[]])
        mover = HostPoolMover(caches, HostPool(2, len(layers) * PAGE))
        assert len(mover.views) == len(layers)
        mover.shutdown()


@pytest.mark.parametrize("backing", [None, "block_major"])
def test_runs_of_adjacent_blocks_and_rows_copy_as_spans(backing):
    # blocks 2,3,4 -> rows 0,1,2 is one span; 5 -> 4 breaks on the row,
    # 7 -> 5 on the block; 0 -> 6 runs on from there.
    assert consecutive_spans(np.array([2, 3, 4, 5, 7, 0]), np.array([0, 1, 2, 4, 5, 6])) == [
        (2, 0, 3),
        (5, 4, 1),
        (7, 5, 1),
        (0, 6, 1),
    ]
    assert consecutive_spans(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == []
    caches, layers = kv_caches(fill=True, backing=backing)
    original = [t.clone() for t in layers]
    pool = HostPool(8, LAYERS * PAGE)
    mover = HostPoolMover(caches, pool)
    mover.submit_store(1, l1([2, 3, 4, 5, 7, 0]), CPULoadStoreSpec([0, 1, 2, 4, 5, 6]))
    mover.wait({1})
    for t in layers:
        t.zero_()
    # Back in one span of rows 0..6 (row 3 was never written) to blocks 1..7.
    mover.submit_load(2, CPULoadStoreSpec(range(7)), l1(range(1, 8)))
    mover.wait({2})
    for before, after in zip(original, layers, strict=True):
        for row, block in zip([0, 1, 2, 4, 5, 6], [2, 3, 4, 5, 7, 0], strict=True):
            assert torch.equal(after[row + 1], before[block]), (row, block)
        assert not after[4].any() and not after[0].any()
    mover.shutdown()


def test_loads_do_not_wait_behind_stores():
    caches, _ = kv_caches(fill=True)
    mover = HostPoolMover(caches, HostPool(4, LAYERS * PAGE))
    release = threading.Event()
    try:
        # A store that cannot finish (its thread is held) does not hold up a load.
        mover._stores.submit(release.wait, 30)
        mover.submit_store(1, l1([0]), CPULoadStoreSpec([0]))
        mover.submit_load(2, CPULoadStoreSpec([3]), l1([5]))
        mover.wait({2})
        assert [r.job_id for r in mover.get_finished()] == [2]
    finally:
        release.set()
    mover.wait({1})
    assert [r.job_id for r in mover.get_finished()] == [1]
    mover.shutdown()


def test_an_idle_step_waits_for_a_pending_load_and_no_longer():
    caches, _ = kv_caches(fill=True)
    mover = HostPoolMover(caches, HostPool(4, LAYERS * PAGE))
    release = threading.Event()
    try:
        assert mover.wait_for_a_load(5.0) is False  # nothing pending: at once
        mover._loads.submit(release.wait, 30)  # the load's thread is held
        mover.submit_load(1, CPULoadStoreSpec([3]), l1([5]))
        mover.submit_store(2, l1([0]), CPULoadStoreSpec([0]))
        mover.wait({2})  # a store that ended does not end the wait
        assert mover.wait_for_a_load(0.05) is False
        release.set()
        assert mover.wait_for_a_load(5.0) is True
        assert sorted(r.job_id for r in mover.get_finished()) == [1, 2]
        assert mover.wait_for_a_load(5.0) is False  # reported: no longer pending
    finally:
        release.set()
        mover.shutdown()


def test_ids_outside_the_cache_or_the_pool_are_refused():
    caches, _ = kv_caches(fill=False)
    mover = HostPoolMover(caches, HostPool(4, LAYERS * PAGE))
    with pytest.raises(LayoutError, match=r"KV block ids 7..8, outside 0..7"):
        mover.submit_store(1, l1([7, 8]), CPULoadStoreSpec([0, 1]))
    with pytest.raises(LayoutError, match=r"pool row ids 3..4, outside 0..3"):
        mover.submit_load(2, CPULoadStoreSpec([3, 4]), l1([0, 1]))
    with pytest.raises(LayoutError, match=r"pool row ids -1..0"):
        mover.submit_load(3, CPULoadStoreSpec([-1, 0]), l1([0, 1]))
    assert mover.get_finished() == []  # nothing was submitted
    mover.shutdown()


@pytest.mark.parametrize("backing", [None, "layer_major"])
def test_pool_rows_hold_layers_side_by_side(backing):
    caches, layers = kv_caches(fill=True, backing=backing)
    pool = HostPool(2, LAYERS * PAGE)
    mover = HostPoolMover(caches, pool)
    mover.submit_store(1, l1([3]), CPULoadStoreSpec([1]))
    mover.wait({1})
    row = pool.array[1].view(np.int8)
    for layer, t in enumerate(layers):
        assert np.array_equal(row[layer * PAGE : (layer + 1) * PAGE], t[3].numpy())
    mover.shutdown()


def test_rows_too_small_for_a_block_are_refused():
    caches, _ = kv_caches(fill=False)
    with pytest.raises(LayoutError, match="a pool row holds"):
        HostPoolMover(caches, HostPool(2, LAYERS * PAGE - 1))


def test_unpaired_block_and_row_counts_are_refused():
    caches, _ = kv_caches(fill=False)
    mover = HostPoolMover(caches, HostPool(2, LAYERS * PAGE))
    with pytest.raises(LayoutError, match="one block per row"):
        mover.submit_store(1, l1([0, 1]), CPULoadStoreSpec([0]))
    mover.shutdown()


def test_the_memoryview_for_the_disk_tier_is_the_pool_itself():
    pool = HostPool(3, 256)
    view = pool.kv_memoryview()
    assert view.shape == (3, 256) and view.strides == (256, 1)
    flat = view.cast("B")
    flat[256 + 7] = 42  # row 1, byte 7
    assert pool.array[1, 7] == 42
    flat.release()
    view.release()
    pool.close()


def test_a_shared_pool_gives_both_sides_one_pool_and_closes_it_with_the_last():
    shared = SharedPool()
    assert shared.existing() is None
    worker_side = shared.open(4, 128)
    assert shared.existing() is worker_side
    scheduler_side = shared.open(4, 128)
    assert scheduler_side is worker_side
    shared.release()
    worker_side.array[0, 0] = 1  # still open for the other side
    shared.release()
    assert shared.existing() is None
    with pytest.raises(RuntimeError, match="released more often than it was opened"):
        shared.release()


def test_a_shared_pool_refuses_two_sides_that_disagree_on_the_shape():
    shared = SharedPool()
    shared.open(4, 128)
    with pytest.raises(ValueError, match="the worker and scheduler disagree on the pool"):
        shared.open(5, 128)
    shared.release()
