"""L3: the disk tier, a vLLM SecondaryTierManager ("fs" in secondary_tiers).

Runs in the engine-core process. vLLM's TieringOffloadingManager calls every
method on the scheduler thread, and none may block: lookups answer from the
in-memory DiskIndex, stores and loads become one task per block on a few
I/O threads (io_threads.py), and ``get_finished_jobs`` applies their outcomes
to the index on the scheduler thread, so the index needs no lock.

Several servers may share one store: the cap, the eviction order and which
blocks exist are kept in a SQLite ledger beside the files (ledger/). The
I/O threads reserve room in it before a store (evicting any server's least
recent blocks) and commit after; a feed thread (ledger/feed.py) writes the
scheduler's touches there and brings other servers' changes to our
namespace back as outcomes, so a block a peer stored becomes a hit here and
one a peer evicted a miss. Loads never touch the ledger.

What crosses the boundary with vLLM: ``TransferJob``s (keys + primary-tier
row numbers, which vLLM keeps pinned until it sees the job's ``JobResult``:
every job gets exactly one), ``JobResult``s, KV events, metric stats.
The bytes move between the primary tier's rows (the L2 host pool, seen as
``primary_kv_view``) and block files (block_file.py), O_DIRECT when the rows
are page aligned.

A block that cannot be served (missing, truncated, corrupted, foreign) is
reported as a failed key, so vLLM recomputes it, and its file is deleted:
never served, never a crash. A full disk pauses stores, with a warning, until
there is room again (full_disk.py); serving goes on from RAM.
"""

from __future__ import annotations

import collections
import os
import queue
import secrets
import time
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
from vllm_uma.kv_offload.disk.block_state import BlockState
from vllm_uma.kv_offload.disk.config import DiskTierConfig
from vllm_uma.kv_offload.disk.full_disk import FullDisk
from vllm_uma.kv_offload.disk.index import DiskIndex
from vllm_uma.kv_offload.disk.io_threads import (
    DEFAULT_IO_THREADS,
    BlockIO,
    IOPool,
    Outcome,
    Priority,
    Shared,
    StoreFailure,
    Ticket,
    delete_task,
    load_task,
    store_task,
    unlinker,
)
from vllm_uma.kv_offload.disk.jobs import PendingJob
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.feed import FeedBatch, LedgerFeed
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.disk.ledger.startup import open_ledger, reconcile
from vllm_uma.kv_offload.disk.messages import DiskWarnings, log_startup
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

# A restore that has not even started after this long is given up (a miss,
# recomputed): recomputing a 4,000-token prompt takes about 3 s here, and a
# healthy queue drains thousands of blocks in that time.
LOAD_DEADLINE_S = 5.0


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
        load_deadline_s: float = LOAD_DEADLINE_S,
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
        self._index: DiskIndex[BlockRef] = DiskIndex()
        # This tier's name in the shared ledger: its own changes come back
        # through the feed and are skipped.
        self._writer = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._ledger = open_ledger(self._layout, self._warnings)
        self._shared = Shared(
            self._layout, self._ledger, self._writer, config.cap_bytes, self._protected
        )
        self._last_stamp = 0
        self._used_bytes = 0
        self._load_deadline_s = load_deadline_s
        self._loads_by_deadline: collections.deque[PendingJob] = collections.deque()
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
        reconcile(self._ledger, found, self._layout.exists, self._writer)
        errors: list[str] = []
        victims = self._ledger.evict_to_cap(  # the cap may have been lowered
            self._config.cap_bytes,
            self._writer,
            lambda ref: False,
            unlinker(self._layout, errors),
        )
        for error in errors:
            self._warnings.unlink(error)
        self._stats.count(m.EVICTED_BLOCKS, len(victims))
        present, seq = self._ledger.snapshot(self._ns)
        for key, size in present:
            self._index.add_present(BlockRef(self._ns, key), size)
        # Announce what this server can restore from the start (least recent
        # first), so that a KV-aware router learns it too.
        self._event([key for key, _ in present], removed=False)
        self._used_bytes = self._ledger.used_bytes()
        io = f"{'O_DIRECT' if self._direct else 'buffered'} I/O on {io_threads} threads"
        log_startup(
            self._config, len(found), len(present), self._used_bytes, len(victims), temps, io
        )
        self._feed = LedgerFeed(self._ledger, self._ns, self._writer, seq, self._outcomes)

    def _protected(self, ref: BlockRef) -> bool:
        """I/O threads: a block our load reads, or that a lookup just hit
        (its load comes at the end of the step), is no victim of ours."""
        return ref in self._index.pinned or self._feed.is_touched(ref)

    def _stamp(self) -> int:
        """A place in the shared LRU order: wall-clock ns, strictly rising."""
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp

    # -- lookups (scheduler thread, no syscalls) ----------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        ref = BlockRef(self._ns, key)
        # A block still being written is a MISS: its bytes are in L2 anyway.
        if not self._index.is_present(ref):
            return LookupResult.MISS
        # A HIT is promoted by a load submitted at the end of this step; the
        # touch keeps stores meanwhile from evicting it.
        self._feed.touch(ref, self._stamp())
        self._stats.count(m.LOOKUP_HITS)
        return LookupResult.HIT

    def holds(self, key: OffloadKey) -> bool:
        """A block file of this key is written and readable (no side effect,
        unlike lookup: the KV memory release asks before giving RAM back)."""
        return self._index.is_present(BlockRef(self._ns, key))

    def touch(self, keys, req_context: ReqContext) -> None:
        self._touch(keys)

    def _touch(self, keys: Iterable[OffloadKey]) -> None:
        for key in reversed(list(keys)):  # the head last: see submit_store
            ref = BlockRef(self._ns, key)
            if self._index.is_present(ref):
                self._feed.touch(ref, self._stamp())

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    # -- stores -------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        job = PendingJob(job_metadata.job_id, list(job_metadata.keys), is_load=False)
        pairs = list(zip(job.keys, job_metadata.chunk_ids, strict=True))
        # Keys come in prefix order. Reserved tail first, the head is the most
        # recent and goes last: without its head, the rest of a prefix is
        # useless (vLLM's block pool frees a request's blocks in reverse too).
        cap = self._config.cap_bytes
        for key, chunk in reversed(pairs):
            ref = BlockRef(self._ns, key)
            skip = self._skip_reason(ref)
            if skip is not None:
                self._stats.count(m.STORE_SKIPPED, reason=skip)
                continue
            if self._full.paused:
                self._store_failed(job, key, StoreFailure.DISK_FULL.value)
                continue
            if cap is not None and self._file_bytes > cap:
                self._store_failed(job, key, Refusal.TOO_BIG.value)
                continue
            # Room is reserved in the shared ledger by the I/O thread.
            self._index.begin_store(ref, self._file_bytes)
            job.pending += 1
            io = self._block_io(job, ref, chunk, stamp=self._stamp())
            self._pool.submit(Priority.STORE, store_task, io)
        self._track(job)

    def _skip_reason(self, ref: BlockRef) -> str | None:
        if ref in self._deleting:
            return "deleting"  # wait for the unlink, or it could hit the new file
        state = self._index.state(ref)
        return None if state is None else state.label

    def _store_failed(self, job: PendingJob, key: OffloadKey, reason: str) -> None:
        job.failed.append(key)
        self._stats.count(m.STORE_FAILED, reason=reason)

    def _evicted(self, victims: Iterable[BlockRef]) -> None:
        """Blocks whose rows and files a reservation of ours removed."""
        removed = [ref.key for ref in victims if self._index.remove(ref) is not None]
        self._event(removed, removed=True)

    def _delete_file(self, ref: BlockRef) -> None:
        self._deleting[ref] = self._deleting.get(ref, 0) + 1
        self._pool.submit(Priority.DELETE, delete_task, BlockIO(None, ref, self._shared))

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
            job.tickets[key] = ticket = Ticket()
            io = self._block_io(job, ref, chunk, ticket=ticket)
            self._pool.submit(Priority.LOAD, load_task, io)
        if job.pending:
            job.deadline = time.monotonic() + self._load_deadline_s
            self._loads_by_deadline.append(job)
        self._track(job)

    def _block_io(
        self, job: PendingJob, ref: BlockRef, chunk: Any, stamp: int = 0, ticket=None
    ) -> BlockIO:
        start = int(chunk) * self.block_size_bytes
        row = self._rows[start : start + self.block_size_bytes]
        return BlockIO(job.job_id, ref, self._shared, row, self._direct, stamp, ticket)

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
        self._give_up_late_loads()
        results, self._results = self._results, []
        return results

    def _give_up_late_loads(self) -> None:
        """A load still queued past its deadline is a miss (recomputed), so
        that I/O threads stuck on a hung file system hold up only the
        requests whose reads they are inside, never the queue behind them.
        Jobs are checked oldest first, and only while one is late."""
        now = time.monotonic()
        while self._loads_by_deadline and self._loads_by_deadline[0].deadline <= now:
            job = self._loads_by_deadline.popleft()
            if job.job_id not in self._jobs:
                continue  # finished in time
            late = job.give_up()
            for key in late:
                self._index.unpin(BlockRef(self._ns, key), job.serials[key])
                job.failed.append(key)
                job.pending -= 1
            if late:
                self._stats.count(m.LOADS_GIVEN_UP, len(late))
                self._warnings.late_loads(len(late), self._load_deadline_s)
            if job.pending == 0:
                self._finish(job)

    def _apply(self, outcome: Outcome | FeedBatch) -> None:
        if isinstance(outcome, FeedBatch):
            self._apply_feed(outcome)
            return
        ref = outcome.ref
        if outcome.job_id is None:  # a delete
            left = self._deleting.pop(ref) - 1
            if left:
                self._deleting[ref] = left
            if not outcome.ok:
                self._warnings.unlink(outcome.detail)
            elif outcome.freed and self._full.on_space():  # our delete freed room
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
        self._stats.count(m.EVICTED_BLOCKS, len(outcome.victims))
        self._evicted(outcome.victims)
        for error in outcome.unlink_errors:
            self._warnings.unlink(error)
        if outcome.taken is not None:
            # Another server stores (or stored) the same block: nothing to write.
            self._index.abort(ref)
            self._stats.count(m.STORE_SKIPPED, reason=outcome.taken.label)
            if outcome.taken is BlockState.PRESENT:
                self._index.add_present(ref, self._file_bytes)
                job.written.append(ref.key)  # restorable from here too: announce
            return
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
        failure = outcome.failure
        self._store_failed(job, ref.key, failure.value)  # type: ignore[union-attr]
        if failure is StoreFailure.DISK_FULL:
            # Every store would fail the same way, and slowly (a full file
            # system searches for space): pause them (full_disk.py).
            if self._full.on_full():
                self._warnings.disk_full(outcome.detail, self._full.retry_in_s)
        elif failure is StoreFailure.LEDGER:
            self._warnings.ledger(outcome.detail)
        elif not isinstance(failure, Refusal):
            self._warnings.store_error(outcome.detail)

    def _apply_feed(self, batch: FeedBatch) -> None:
        """Other servers' changes to our namespace, in the ledger's order."""
        if batch.used_bytes is not None:
            self._used_bytes = batch.used_bytes
        changes = batch.changes
        if batch.snapshot is not None:  # changes were missed: diff the lot
            present = {BlockRef(self._ns, key): size for key, size in batch.snapshot}
            gone = [
                ref for ref in self._index if self._index.is_present(ref) and ref not in present
            ]
            changes = [(ref.key, 0, False) for ref in gone]
            changes += [(ref.key, size, True) for ref, size in present.items()]
        for key, size, added in changes:
            ref = BlockRef(self._ns, key)
            if added and self._index.add_present(ref, size):
                self._stats.count(m.PEER_CHANGES, reason="added")
                self._event([key], removed=False)
            elif not added and self._index.remove(ref) is not None:
                self._stats.count(m.PEER_CHANGES, reason="removed")
                self._event([key], removed=True)

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
            # Out of the ledger too (a missing file's row would mislead every
            # server), and the file deleted in the same transaction.
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
                    # None, as vLLM's own fs tier: "ownership" marks a pool
                    # shared by many engines (kvcr), which a router credits
                    # as remote and refuses with LOCAL locality.
                    ownership=None,
                )
            )

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    def get_stats(self):
        self._stats.gauge(m.USED_BYTES, self._used_bytes)
        return self._stats.take()

    @property
    def used_bytes(self) -> int:
        """The store's bytes, all servers (reads the ledger: for tools and
        tests, not the scheduler thread, which has the metric)."""
        return self._ledger.used_bytes()

    def has_pending_work(self) -> bool:
        return bool(self._jobs or self._results or self._deleting)

    def drain_jobs(self) -> None:
        self._pool.wait_idle()
        self._feed.flush()  # touches into the ledger, peers' changes in

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        stopped = self._pool.shutdown()
        self._feed.stop(timeout_s=2.0)
        if not stopped.stuck_threads:
            # A thread left behind may still walk from the root handle, or
            # hold a ledger transaction.
            self._ledger.close()
            self._layout.close()
        dropped_stores = stopped.dropped.get(Priority.STORE, 0)
        self._warnings.stopped(self._written_this_run, dropped_stores)
        if stopped.stuck_threads:
            # A thread still inside a read or write holds a slice of the
            # rows: they cannot be released, and the process is stopping.
            self._warnings.stuck_threads(stopped.stuck_threads)
            return
        self._rows.release()  # the primary tier closes its mmap after this
