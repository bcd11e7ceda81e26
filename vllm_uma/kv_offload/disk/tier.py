"""L3: the disk tier, a vLLM SecondaryTierManager ("fs" in secondary_tiers).

Runs in the engine-core process. vLLM's TieringOffloadingManager calls every
method on the scheduler thread, and none may block: lookups answer from the
in-memory DiskIndex, stores and loads become one task per block on a few
I/O threads (io_threads.py), and ``get_finished_jobs`` applies their outcomes
to the index on the scheduler thread, so the index needs no lock.

What crosses the boundary with vLLM: ``TransferJob``s (keys + primary-tier
row numbers, which vLLM keeps pinned until it sees the job's ``JobResult``:
every job gets exactly one), ``JobResult``s, KV events, metric stats.
The bytes move between the primary tier's rows (the L2 host pool, seen as
``primary_kv_view``) and block files (block_file.py), O_DIRECT when the rows
are page aligned.

A block that cannot be served (missing, truncated, corrupted, foreign) is
reported as a failed key, so vLLM recomputes it, and its file is deleted:
never served, never a crash. A full disk stops all later stores, with one
warning; serving goes on from RAM.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from vllm_uma.kv_offload.disk import metrics as m
from vllm_uma.kv_offload.disk.block_file import (
    DIRECT_ALIGN,
    BadReason,
    file_bytes,
    is_direct_capable,
    probe_direct,
)
from vllm_uma.kv_offload.disk.config import DiskTierConfig
from vllm_uma.kv_offload.disk.full_disk import FullDisk
from vllm_uma.kv_offload.disk.index import DiskIndex, Refusal
from vllm_uma.kv_offload.disk.io_threads import (
    DEFAULT_IO_THREADS,
    BlockIO,
    IOPool,
    Outcome,
    Priority,
    StoreFailure,
    delete_task,
    load_task,
    store_task,
)
from vllm_uma.kv_offload.disk.jobs import PendingJob
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.messages import DiskWarnings, log_startup


class DiskTier(SecondaryTierManager):
    medium: ClassVar[Medium] = Medium.STORAGE

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return m.definitions()

    def __init__(
        self,
        offloading_spec,
        primary_kv_view: memoryview,
        tier_type: str,
        *,
        config: DiskTierConfig,
        namespace_id: bytes,
        namespace_info: dict[str, Any],
        backpressure_detector=None,
        io_threads: int = DEFAULT_IO_THREADS,
        full_disk: FullDisk | None = None,
    ):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality.LOCAL
        self._config = config
        self._ns = namespace_id
        self._layout = Layout(config.root_dir)
        self._warnings = DiskWarnings(config.root_dir)
        error = self._layout.prepare(namespace_id, namespace_info)
        if error is not None:
            self._warnings.namespace_file(error)
        self._rows = primary_kv_view.cast("B")  # row c = bytes [c*row, (c+1)*row)
        self._file_bytes = file_bytes(self.block_size_bytes)
        self._direct = (
            self.block_size_bytes % DIRECT_ALIGN == 0
            and is_direct_capable(self._rows)
            and probe_direct(self._layout.namespace_dir(namespace_id))
        )
        self._index: DiskIndex[BlockRef] = DiskIndex(config.cap_bytes)
        self._stats = m.DiskStats()
        self._stats.gauge(m.CAP_BYTES, config.cap_bytes or 0)
        self._events: list[OffloadingEvent] | None = [] if config.enable_kv_events else None
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._jobs: dict[int, PendingJob] = {}
        self._results: list[JobResult] = []  # finished, not yet returned
        self._deleting: dict[BlockRef, int] = {}  # deletes in flight per block
        self._full = FullDisk() if full_disk is None else full_disk
        self._written_this_run = 0
        self._pool = IOPool(io_threads, self._outcomes, "uma-kv-disk")
        self._closed = False
        self._load_existing(io_threads)

    def _load_existing(self, io_threads: int) -> None:
        # A large store takes a while to walk: say so first (log_startup
        # then says what was found).
        self._warnings.scanning()
        found, temps = self._layout.scan()
        for block in found:
            self._index.add_existing(block.ref, block.size)
        nbytes = self._index.used_bytes
        victims = self._index.evict_to_cap()  # the cap may have been lowered
        self._evict(victims, announce=False)
        # Announce what this server holds on disk from the start, so that a
        # KV-aware router learns it too (oldest first, as they were stored).
        gone = {ref for ref, _ in victims}
        self._event(
            [b.ref.key for b in found if b.ref.namespace == self._ns and b.ref not in gone],
            removed=False,
        )
        ours = sum(block.ref.namespace == self._ns for block in found)
        io = f"{'O_DIRECT' if self._direct else 'buffered'} I/O on {io_threads} threads"
        log_startup(self._config, len(found), ours, nbytes, len(victims), temps, io)

    # -- lookups (scheduler thread, no syscalls) ----------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        ref = BlockRef(self._ns, key)
        # A block still being written is a MISS: its bytes are in L2 anyway.
        if not self._index.is_present(ref):
            return LookupResult.MISS
        # A HIT is promoted by a load submitted at the end of this step; going
        # last keeps a store in the same step from evicting it first.
        self._index.touch(ref)
        self._stats.count(m.LOOKUP_HITS)
        return LookupResult.HIT

    def touch(self, keys, req_context: ReqContext) -> None:
        self._touch(keys)

    def _touch(self, keys: Iterable[OffloadKey]) -> None:
        for key in reversed(list(keys)):  # the head last: see submit_store
            self._index.touch(BlockRef(self._ns, key))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    # -- stores -------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        job = PendingJob(job_metadata.job_id, list(job_metadata.keys), is_load=False)
        pairs = list(zip(job.keys, job_metadata.chunk_ids, strict=True))
        # Keys come in prefix order. Reserved tail first, the head is the most
        # recent and goes last: without its head, the rest of a prefix is
        # useless (vLLM's block pool frees a request's blocks in reverse too).
        for key, chunk in reversed(pairs):
            ref = BlockRef(self._ns, key)
            skip = self._skip_reason(ref)
            if skip is not None:
                self._stats.count(m.STORE_SKIPPED, reason=skip)
                continue
            if self._full.paused:
                self._store_failed(job, key, StoreFailure.DISK_FULL.value)
                continue
            reserved = self._index.reserve(ref, self._file_bytes)
            if isinstance(reserved, Refusal):
                self._store_failed(job, key, reserved.value)
                continue
            self._evict(reserved, announce=True)
            job.pending += 1
            self._pool.submit(Priority.STORE, store_task, self._block_io(job, ref, chunk))
        self._track(job)

    def _skip_reason(self, ref: BlockRef) -> str | None:
        if ref in self._deleting:
            return "deleting"  # wait for the unlink, or it could hit the new file
        state = self._index.state(ref)
        return None if state is None else state.value

    def _store_failed(self, job: PendingJob, key: OffloadKey, reason: str) -> None:
        job.failed.append(key)
        self._stats.count(m.STORE_FAILED, reason=reason)

    def _evict(self, victims: list[tuple[BlockRef, int]], *, announce: bool) -> None:
        removed = []
        for ref, _ in victims:
            self._delete_file(ref)
            if ref.namespace == self._ns:
                removed.append(ref.key)
        self._stats.count(m.EVICTED_BLOCKS, len(victims))
        if announce:
            self._event(removed, removed=True)

    def _delete_file(self, ref: BlockRef) -> None:
        self._deleting[ref] = self._deleting.get(ref, 0) + 1
        io = BlockIO(None, ref, self._layout, self._layout.path(ref))
        self._pool.submit(Priority.DELETE, delete_task, io)

    # -- loads --------------------------------------------------------------

    def submit_load(self, job_metadata: TransferJob) -> None:
        job = PendingJob(job_metadata.job_id, list(job_metadata.keys), is_load=True)
        for key, chunk in zip(job.keys, job_metadata.chunk_ids, strict=True):
            ref = BlockRef(self._ns, key)
            serial = self._index.pin(ref)
            if serial is None:  # evicted or found bad since its lookup
                job.failed.append(key)
                continue
            job.serials[key] = serial
            job.pending += 1
            self._pool.submit(Priority.LOAD, load_task, self._block_io(job, ref, chunk))
        self._track(job)

    def _block_io(self, job: PendingJob, ref: BlockRef, chunk: Any) -> BlockIO:
        start = int(chunk) * self.block_size_bytes
        row = self._rows[start : start + self.block_size_bytes]
        return BlockIO(
            job.job_id, ref, self._layout, self._layout.path(ref), self._ns, row, self._direct
        )

    # -- completion (scheduler thread) --------------------------------------

    def _track(self, job: PendingJob) -> None:
        self._jobs[job.job_id] = job
        if job.pending == 0:  # nothing to wait for: all skipped or failed
            self._finish(job)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        while True:
            try:
                outcome = self._outcomes.get_nowait()
            except queue.Empty:
                break
            self._apply(outcome)
        results, self._results = self._results, []
        return results

    def _apply(self, outcome: Outcome) -> None:
        ref = outcome.ref
        if outcome.job_id is None:  # a delete
            left = self._deleting.pop(ref) - 1
            if left:
                self._deleting[ref] = left
            if not outcome.ok:
                self._warnings.unlink(outcome.detail)
            elif outcome.nbytes and self._full.on_space():  # our delete freed room
                self._warnings.space_is_back()
            return
        job = self._jobs[outcome.job_id]
        if job.is_load:
            self._apply_load(job, ref, outcome)
        else:
            self._apply_store(job, ref, outcome)
        if job.note(outcome):
            self._finish(job)

    def _apply_store(self, job: PendingJob, ref: BlockRef, outcome: Outcome) -> None:
        if outcome.ok:
            if self._full.on_space():
                self._warnings.space_is_back()
            self._index.commit(ref)
            self._written_this_run += 1
            job.written.append(ref.key)
            self._stats.count(m.WRITTEN_BLOCKS)
            self._stats.count(m.WRITTEN_BYTES, outcome.nbytes)
            return
        self._index.abort(ref)
        self._store_failed(job, ref.key, outcome.failure.value)  # type: ignore[union-attr]
        if outcome.failure is StoreFailure.DISK_FULL:
            # Every store would fail the same way, and slowly (a full file
            # system searches for space): pause them (full_disk.py).
            if self._full.on_full():
                self._warnings.disk_full(outcome.detail, self._full.retry_in_s)
        else:
            self._warnings.store_error(outcome.detail)

    def _apply_load(self, job: PendingJob, ref: BlockRef, outcome: Outcome) -> None:
        serial = job.serials[ref.key]
        self._index.unpin(ref, serial)
        if outcome.ok:  # touched when the whole job ends, in prefix order
            self._stats.count(m.READ_BLOCKS)
            self._stats.count(m.READ_BYTES, outcome.nbytes)
            return
        job.failed.append(ref.key)
        if not isinstance(outcome.failure, BadReason):
            # Our own code failed, not the file: recompute this time, keep the
            # block (only a file-level error deletes a file).
            self._warnings.load_error(outcome.detail)
            return
        reason = outcome.failure
        self._stats.count(m.BAD_BLOCKS, reason=reason.value)
        self._warnings.bad_block(reason, outcome.detail)
        # Only the generation this load read: a newer store of the key stays.
        if self._index.remove(ref, serial) is not None:
            self._event([ref.key], removed=True)
            if reason is not BadReason.MISSING:
                self._delete_file(ref)

    def _finish(self, job: PendingJob) -> None:
        del self._jobs[job.job_id]
        if job.is_load:
            failed = set(job.failed)
            self._touch([key for key in job.keys if key not in failed])
        written = set(job.written)  # announced in the job's (prefix) order
        self._event([key for key in job.keys if key in written], removed=False)
        self._results.append(job.result())

    # -- events, metrics, life cycle ----------------------------------------

    def _event(self, keys: list[OffloadKey], *, removed: bool) -> None:
        if self._events is not None and keys:
            self._events.append(
                OffloadingEvent(
                    keys=keys,
                    medium=self.medium,
                    removed=removed,
                    locality=self.locality,
                    ownership=self.tier_type,
                )
            )

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def get_stats(self):
        self._stats.gauge(m.USED_BYTES, self._index.used_bytes)
        return self._stats.take()

    def has_pending_work(self) -> bool:
        return bool(self._jobs or self._results or self._deleting)

    def drain_jobs(self) -> None:
        self._pool.wait_idle()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        stopped = self._pool.shutdown()
        if not stopped.stuck_threads:
            # A thread left behind may still walk from the root handle.
            self._layout.close()
        dropped_stores = stopped.dropped.get(Priority.STORE, 0)
        self._warnings.stopped(self._written_this_run, dropped_stores)
        if stopped.stuck_threads:
            # A thread still inside a read or write holds a slice of the
            # rows: they cannot be released, and the process is stopping.
            self._warnings.stuck_threads(stopped.stuck_threads)
            return
        self._rows.release()  # the primary tier closes its mmap after this
