"""Worker side: copy KV blocks between vLLM's KV cache (L1) and the host pool (L2).

Runs in the worker, on two background threads, so a store or a load does
not hold up the engine step that submitted it (numpy releases the GIL while
it copies). vLLM's offloading connector drives it through the
OffloadingWorker contract: ``submit_store``/``submit_load`` return at once,
``get_finished`` reports completed jobs (every job succeeds or the process is
broken: the connector treats a failure as fatal), ``wait`` blocks until given
jobs end.

One thread per direction, each running its jobs in submission order, as
vLLM's GPU worker keeps one stream per direction: the connector already
orders what crosses (a load only reads pool rows whose store completed; a
block a pending store still reads is fenced with ``wait`` before reuse).
Loads no longer wait behind stores: a restoring request waits for its load.
Both threads run at the process's priority. (Stores at nice 19 were tried:
on no_reuse traffic the difference was within this host's noise, and a
niced store can stall the engine when it must ``wait`` for that store
before reusing a block while other threads are runnable.)

One L1 block maps to one pool row (blocks_per_chunk == 1, checked by the
spec). A job's (block, row) pairs are first cut into spans where both run
consecutively; each span is then one numpy slice assignment, a single
strided copy straight from source to destination. vLLM puts every layer's
KV in one backing buffer at a fixed distance from the next, so one strided
view covers a block across all layers and a span is one copy for the whole
model (``cross_layer_views``); otherwise one copy per layer per span.

Why so few, large copies: numpy drops the GIL while it copies, but each copy
must take it back to start the next, and a thread asking for the GIL waits
up to the switch interval (5 ms) while the engine's Python holds it. One copy
per layer per block (930 for a 4k-token prefix of the default model) moved
0.13 GB/s beside a busy Python thread; one per block, 0.5 GB/s. A gather
(``layer[blocks]``) then a scatter would copy every byte twice through a
temporary: 7-12 GB/s here where memcpy moved 15-20; the slices move 80-105%
of memcpy (tools/benchmark/kv_pool_bandwidth.py). numpy, not torch: torch's
int8 copies here moved 0.8-11 GB/s.

Each job's copy is split across up to ``copy_threads`` threads (the job's
own direction thread and shared helpers), by layer: part i copies layers
[a_i, b_i) of every span, so the parts are equal whatever the spans, touch
disjoint bytes, and a one-block job splits too. One thread did not reach
the machine's memory bandwidth: a 455 MB copy took 36 ms on one thread and
19 ms on two here, and when the L1 pages are touched for the first time
(the first restore into a fresh server) the page faults run in parallel as
well (294 -> 150 ms for the same copy into untouched pages). Jobs under
``SPLIT_MIN_BYTES`` run on one thread: a hand-off costs more than it saves.

A step that only waits for loads waits here. While a request waits for its
KV, vLLM's engine loop steps every millisecond to ask whether the load is
done, and on two cores that step takes CPU from the copy threads: a 455 MB
load ran 21 ms alone and 30 ms beside a thread busy 0.5 ms of every 1.5 ms
(the same split, measured here). The connector calls
:meth:`HostPoolMover.wait_for_a_load` in a step that scheduled no tokens,
so the loop sleeps until a load ends or ``IDLE_STEP_WAIT_S`` has passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.log import get_logger

logger = get_logger(__name__)


# A job smaller than this is copied by one thread (a 128-token block of the
# default model is 2.9 MB; of an 8B model's, 16-19 MB).
SPLIT_MIN_BYTES = 4 << 20
# More threads than this gained nothing where measured (2 cores here); a
# copy past the memory bandwidth only takes cores from the engine.
MAX_COPY_THREADS = 4
# The longest a step with nothing scheduled waits for a load to end: a new
# request that arrives meanwhile reaches the scheduler this much later at
# most (vLLM's own loop sleeps 1 ms between such steps).
IDLE_STEP_WAIT_S = 0.005

# (L1 view, pool view) pairs a thread copies for every span of a job.
ViewPairs = list[tuple[np.ndarray, np.ndarray]]


class LayoutError(ValueError):
    """The KV cache does not fit the pool's rows."""


def default_copy_threads() -> int:
    """One copy thread per core this process may run on, up to MAX_COPY_THREADS."""
    return max(1, min(MAX_COPY_THREADS, len(os.sched_getaffinity(0))))


class HostPoolMover(OffloadingWorker):
    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        pool: HostPool,
        on_shutdown: Callable[[], None] | None = None,
        copy_threads: int | None = None,
    ):
        self.pool = pool
        # Gives the pool back to whoever lent it (the engine's SharedPool, spec.py).
        self._on_shutdown = on_shutdown
        # uint8 numpy views of the same bytes as vLLM's KV tensors.
        self.layers: list[np.ndarray] = []
        self.offsets: list[int] = []
        offset = 0
        for canonical in kv_caches.tensors:
            layer = canonical.tensor
            layer = layer.view(layer.shape[0], -1).view(torch.uint8).numpy()
            self.layers.append(layer)
            self.offsets.append(offset)
            offset += layer.shape[1]
        if offset > pool.row_bytes:
            raise LayoutError(
                f"one block of KV is {offset} bytes across {len(self.layers)} "
                f"tensors, but a pool row holds {pool.row_bytes}"
            )
        self.block_bytes = offset
        # (L1 view, pool view) pairs indexed by block and by row: one pair
        # over every layer when the layers sit at one stride in vLLM's
        # backing buffer, else one pair per layer.
        self.views = cross_layer_views(self.layers, pool.array) or [
            (layer, pool.array[:, offset : offset + layer.shape[1]])
            for layer, offset in zip(self.layers, self.offsets, strict=True)
        ]
        self.parts = split_views(self.views, copy_threads or default_copy_threads())
        logger.info(
            "KV offload copies: %d KV tensors, %s, split across %d thread(s)",
            len(self.layers),
            "one strided copy per run of blocks across all of them"
            if len(self.views) == 1
            else "one copy per tensor per run of blocks",
            len(self.parts),
        )
        self._stores = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uma-kv-store")
        self._loads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uma-kv-load")
        # Shared by both directions; a helper only copies, never submits, so
        # a direction thread waiting on its helpers cannot deadlock.
        self._helpers = (
            ThreadPoolExecutor(max_workers=len(self.parts) - 1, thread_name_prefix="uma-kv-copy")
            if len(self.parts) > 1
            else None
        )
        self._jobs: dict[int, Future] = {}
        self._load_ids: set[int] = set()

    # -- the copies ---------------------------------------------------------

    def _store(self, blocks: np.ndarray, rows: np.ndarray) -> TransferResult:
        start = time.perf_counter()
        self._copy(consecutive_spans(blocks, rows), len(blocks), _store_part)
        return self._result(len(blocks), start)

    def _load(self, rows: np.ndarray, blocks: np.ndarray) -> TransferResult:
        start = time.perf_counter()
        self._copy(consecutive_spans(blocks, rows), len(blocks), _load_part)
        return self._result(len(blocks), start)

    def _copy(self, spans, num_blocks: int, copy_part) -> None:
        """Run copy_part over every part: the helpers take all but the first,
        this thread the first; returns when all are done (re-raising the
        first failure, after every part has stopped touching the buffers)."""
        if self._helpers is None or num_blocks * self.block_bytes < SPLIT_MIN_BYTES:
            for part in self.parts:
                copy_part(part, spans)
            return
        others = [self._helpers.submit(copy_part, part, spans) for part in self.parts[1:]]
        try:
            copy_part(self.parts[0], spans)
        finally:
            errors = [fut.exception() for fut in others]
        for error in errors:
            if error is not None:
                raise error

    def _result(self, num_blocks: int, start: float) -> TransferResult:
        # job_id is filled in by the caller; size and time feed vLLM's metrics.
        return TransferResult(
            job_id=-1,
            success=True,
            transfer_size=num_blocks * self.block_bytes,
            transfer_time=time.perf_counter() - start,
        )

    # -- the OffloadingWorker contract -------------------------------------

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        blocks, rows = _ids(src_spec), _ids(dst_spec)
        self._check_pairs(job_id, blocks, rows)
        self._jobs[job_id] = self._stores.submit(self._store, blocks, rows)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        rows, blocks = _ids(src_spec), _ids(dst_spec)
        self._check_pairs(job_id, blocks, rows)
        self._jobs[job_id] = self._loads.submit(self._load, rows, blocks)
        self._load_ids.add(job_id)
        return True

    def _check_pairs(self, job_id: int, blocks: np.ndarray, rows: np.ndarray) -> None:
        """Refuse a job the copies would get wrong: slices clip an id past
        the end silently (and broadcast what is left), where indexing raised."""
        if len(blocks) != len(rows):
            raise LayoutError(
                f"transfer job {job_id} pairs {len(blocks)} KV blocks with "
                f"{len(rows)} pool rows; one block per row is required"
            )
        for name, ids, count in (
            ("KV block", blocks, self.layers[0].shape[0]),
            ("pool row", rows, self.pool.num_rows),
        ):
            if len(ids) and (ids.min() < 0 or ids.max() >= count):
                raise LayoutError(
                    f"transfer job {job_id} names {name} ids {ids.min()}..{ids.max()}, "
                    f"outside 0..{count - 1}"
                )

    def get_finished(self) -> list[TransferResult]:
        done = [job_id for job_id, fut in self._jobs.items() if fut.done()]
        return [self._finish(job_id) for job_id in done]

    def wait_for_a_load(self, timeout_s: float = IDLE_STEP_WAIT_S) -> bool:
        """Block until one of the loads not yet reported ends, or
        ``timeout_s`` passes; False at once when no load is pending. The
        GIL is free meanwhile (the copy threads need it between copies)."""
        pending = [self._jobs[i] for i in self._load_ids if i in self._jobs]
        if not pending:
            return False
        done, _ = wait_futures(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)
        return bool(done)

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            fut = self._jobs.get(job_id)
            if fut is not None:
                fut.result()

    def _finish(self, job_id: int) -> TransferResult:
        self._load_ids.discard(job_id)
        result = self._jobs.pop(job_id).result()  # re-raises a failed copy
        result.job_id = job_id
        return result

    def shutdown(self) -> None:
        self._stores.shutdown(wait=True)
        self._loads.shutdown(wait=True)
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
        self._jobs.clear()
        self._load_ids.clear()
        if self._on_shutdown is not None:
            self._on_shutdown()
            self._on_shutdown = None


def _store_part(part: ViewPairs, spans) -> None:
    for l1, pool in part:
        for block, row, count in spans:
            pool[row : row + count] = l1[block : block + count]


def _load_part(part: ViewPairs, spans) -> None:
    for l1, pool in part:
        for block, row, count in spans:
            l1[block : block + count] = pool[row : row + count]


def split_views(views: ViewPairs, threads: int) -> list[ViewPairs]:
    """Cut the (L1, pool) view pairs into at most ``threads`` parts of about
    equal bytes that cover every byte once: one cross-layer pair is cut along
    its layer axis, per-layer pairs are dealt out in turn."""
    if threads < 1:
        raise ValueError(f"copy_threads={threads}: at least one copy thread is needed")
    if len(views) == 1 and views[0][0].ndim == 3:
        l1, pool = views[0]
        num_layers = l1.shape[1]
        bounds = np.linspace(0, num_layers, min(threads, num_layers) + 1).astype(int)
        return [[(l1[:, a:b], pool[:, a:b])] for a, b in zip(bounds, bounds[1:], strict=False)]
    count = min(threads, len(views))
    return [views[i::count] for i in range(count)]


def cross_layer_views(
    layers: list[np.ndarray], pool: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """One (blocks, layers, page) view of L1 and one (rows, layers, page) of
    the pool, when every layer has the same shape and block stride and the
    layers start at one fixed distance from each other (vLLM places them in
    one backing buffer); None otherwise.

    Each layer's start is checked against the view's, so the strided view
    addresses exactly the layers' own bytes and nothing between them.
    """
    if len(layers) < 2:
        return None
    first = layers[0]
    if first.strides[1] != 1:
        return None
    if any(a.shape != first.shape or a.strides != first.strides for a in layers):
        return None
    address = [a.ctypes.data for a in layers]
    layer_stride = address[1] - address[0]
    if any(address[i] != address[0] + i * layer_stride for i in range(len(layers))):
        return None
    num_blocks, page = first.shape
    block_stride = first.strides[0]
    # Layers that overlap (groups overlaid on the same bytes) are copied one
    # by one, as vLLM laid them out.
    if abs(layer_stride) < page:
        return None
    l1 = np.lib.stride_tricks.as_strided(
        first, (num_blocks, len(layers), page), (block_stride, layer_stride, 1), writeable=True
    )
    rows = pool[:, : len(layers) * page]
    pool_view = np.lib.stride_tricks.as_strided(
        rows, (rows.shape[0], len(layers), page), (rows.strides[0], page, 1), writeable=True
    )
    return [(l1, pool_view)]


def consecutive_spans(blocks: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, int]]:
    """(first block, first row, count) for each run where both ids step by 1.

    Order is kept: a job that names the same block or row twice copies in
    the order it was given, as the gather/scatter it replaces did.
    """
    if len(blocks) == 0:
        return []
    breaks = np.flatnonzero((np.diff(blocks) != 1) | (np.diff(rows) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(blocks)]))
    return [(int(blocks[s]), int(rows[s]), int(e - s)) for s, e in zip(starts, ends, strict=True)]


def _ids(spec: LoadStoreSpec) -> np.ndarray:
    return np.asarray(spec.block_ids, dtype=np.int64)
