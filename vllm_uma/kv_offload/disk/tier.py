"""L3: the disk tier, a vLLM SecondaryTierManager ("fs" in secondary_tiers).

Runs in the engine-core process. vLLM's TieringOffloadingManager calls every
method on the scheduler thread, and none may block: lookups answer from the
in-memory DiskIndex, stores and loads become one task per block on a few
I/O threads (io_tasks.py, on the lower tier's threads: lower_tier/), and
``get_finished_jobs`` applies their outcomes to the index on the scheduler
thread (completion.py), so the index needs no lock. Start-up
(tier_startup.py) opens the store and loads what it holds.

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

import queue
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

from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk.block_file import FileId
from vllm_uma.kv_offload.disk.completion import Completion, PendingJob
from vllm_uma.kv_offload.disk.full_disk import FullDisk
from vllm_uma.kv_offload.disk.index import DiskIndex
from vllm_uma.kv_offload.disk.io_descriptors import BlockIO, Outcome, Shared, StoreFailure, Ticket
from vllm_uma.kv_offload.disk.io_tasks import (
    DEFAULT_IO_THREADS,
    delete_task,
    load_task,
    start_io_threads,
    store_task,
)
from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.ledger.feed import LedgerFeed
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.disk.reports import DiskWarnings
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.disk.tier_startup import load_existing, open_store, settle_later
from vllm_uma.kv_offload.lower_tier.threads import Priority
from vllm_uma.kv_offload.mac_keys import KeySource
from vllm_uma.log import get_logger
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

logger = get_logger(__name__)

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
        settings: DiskTierSettings,
        namespace_id: bytes,
        namespace_info: dict[str, Any],
        backpressure_detector=None,
        io_threads: int = DEFAULT_IO_THREADS,
        full_disk: FullDisk | None = None,
        load_deadline_s: float = LOAD_DEADLINE_S,
    ):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality.LOCAL
        self._settings = settings
        self._ns = namespace_id
        self._warnings = DiskWarnings(settings.root_dir)
        self._store = open_store(
            settings, namespace_id, namespace_info, primary_kv_view, self.block_size_bytes,
            self._warnings,
        )  # fmt: skip
        self._index: DiskIndex[BlockRef] = DiskIndex()
        self._reports = m.tier_reports(settings, self.medium, self.locality, self._warnings)
        self._full = FullDisk() if full_disk is None else full_disk
        # What applies the I/O's outcomes (completion.py); it calls back to
        # touch the blocks a load restored and to delete a bad block's file.
        self._done = Completion(
            self._ns, self._index, self._reports, self._warnings, self._full,
            self._store.file_bytes, load_deadline_s, self._touch, self._delete_file,
        )  # fmt: skip
        self._last_stamp = 0
        self._closed = False
        self._start(io_threads)

    def _start(self, num_threads: int) -> None:
        """The I/O threads, what the store holds, then the feed from there."""
        store, settings, namespace_id = self._store, self._settings, self._ns
        ledger, writer = store.ledger, store.writer
        self._shared = Shared(
            store.layout, ledger, writer, settings.cap_bytes, self._protected, _key_source(settings)
        )
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._pool = start_io_threads(num_threads, self._outcomes)
        found = load_existing(
            store, settings, namespace_id, self._index, self._reports, self._warnings, num_threads
        )
        self._done.used_bytes = found.used_bytes
        self._feed = LedgerFeed(ledger, namespace_id, writer, found.seq, self._outcomes)
        self._settle = None
        if not found.settled:  # a full disk: tried again once stores find space
            cap = settings.cap_bytes
            self._settle = settle_later(store, cap, self._protected, self._warnings)

    def _protected(self, ref: BlockRef) -> bool:
        """I/O threads: a block our load reads, or that a lookup just hit
        (its load comes at the end of the step), is no victim of ours."""
        return ref in self._index.pinned or self._feed.is_touched(ref)

    def is_pinned(self, key: OffloadKey) -> bool:
        """A live pin of our namespace holds this block (as of the feed's
        last read, at most a second old): the host pool keeps it too."""
        return key in self._feed.pinned

    def pinned_keys(self) -> frozenset[bytes]:
        """The keys live pins of our namespace hold, as the feed last read
        them (replaced whole: any thread may read it without a lock)."""
        return self._feed.pinned

    @property
    def pin_facts(self) -> tuple[bytes, int]:
        """What a pin records of this tier: its namespace and the bytes of
        one block file."""
        return self._ns, self._store.file_bytes

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
        self._reports.hit()
        return LookupResult.HIT

    def holds(self, key: OffloadKey) -> bool:
        """A block file of this key is written and readable (no side effect,
        unlike lookup: the KV memory release asks before giving RAM back,
        memory_release/tiers.py's BlockHolder)."""
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
        cap, file_bytes = self._settings.cap_bytes, self._store.file_bytes
        settling = self._settle
        if settling is not None and not self._full.paused and settling.due():
            self._pool.submit(Priority.STORE, settling.run, None)
        for key, chunk in reversed(pairs):
            ref = BlockRef(self._ns, key)
            skip = self._done.skip_reason(ref)
            if skip is not None:
                self._reports.store_skipped(reason=skip)
                continue
            if self._full.paused:
                self._done.store_failed(job, key, StoreFailure.DISK_FULL.value)
                continue
            if cap is not None and file_bytes > cap:
                self._done.store_failed(job, key, Refusal.TOO_BIG.value)
                continue
            # Room is reserved in the shared ledger by the I/O thread.
            self._index.begin_store(ref, file_bytes)
            job.pending += 1
            io = self._block_io(job, ref, chunk, stamp=self._stamp())
            self._pool.submit(Priority.STORE, store_task, io)
        self._done.track(job)

    def _delete_file(self, ref: BlockRef, seen: FileId | None) -> None:
        deleting = self._done.deleting
        deleting[ref] = deleting.get(ref, 0) + 1
        io = BlockIO(None, ref, self._shared, seen=seen)
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
            job.tickets[key] = ticket = Ticket()
            io = self._block_io(job, ref, chunk, ticket=ticket)
            self._pool.submit(Priority.LOAD, load_task, io)
        self._done.track(job)

    def _block_io(
        self, job: PendingJob, ref: BlockRef, chunk: Any, stamp: int = 0, ticket=None
    ) -> BlockIO:
        row = self._store.row(chunk)
        return BlockIO(job.job_id, ref, self._shared, row, self._store.direct, stamp, ticket)

    # -- completion (scheduler thread: completion.py) ------------------------

    def get_finished_jobs(self) -> Iterable[JobResult]:
        return self._done.finished_jobs(self._outcomes)

    # -- events, metrics, life cycle ------------------------------------------

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._reports.take_events()

    def get_stats(self):
        self._reports.stats.gauge(m.USED_BYTES, self._done.used_bytes)
        pinned_blocks, pinned_bytes = self._feed.pinned_on_disk
        self._reports.stats.gauge(m.PINNED_BLOCKS, pinned_blocks)
        self._reports.stats.gauge(m.PINNED_BYTES, pinned_bytes)
        return self._reports.stats.take()

    @property
    def used_bytes(self) -> int:
        """The store's bytes, all servers (reads the ledger: for tools and
        tests, not the scheduler thread, which has the metric)."""
        return self._store.ledger.used_bytes()

    def has_pending_work(self) -> bool:
        return self._done.has_pending_work()

    def drain_jobs(self) -> None:
        self._pool.wait_idle()
        self._feed.flush()  # touches into the ledger, peers' changes in

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        stopped = self._pool.shutdown()  # writes the stores queued so far first
        # No step comes after this one to apply what the drain wrote: count
        # it here, for the stop's line.
        self._done.finished_jobs(self._outcomes)
        self._feed.stop(timeout_s=2.0)
        dropped_stores = stopped.dropped.get(Priority.STORE, 0)
        self._warnings.stopped(self._done.written_this_run, dropped_stores)
        if stopped.stuck_threads:
            # A thread left behind may still walk from the root handle, hold
            # a ledger transaction, or be inside a read or write, holding a
            # slice of the rows: nothing is closed, the process is stopping.
            self._warnings.stuck_threads(stopped.stuck_threads)
            return
        self._store.close()  # the primary tier closes its mmap after this


def _key_source(settings: DiskTierSettings) -> KeySource | None:
    """The keys of signed block files, read here at start-up (a secret gone
    since the settings were checked fails the start with its fix), and said
    in one line; None when the user asked for none."""
    if settings.secret_file is None and settings.secret_env is None:
        return None
    source = KeySource(
        env=settings.secret_env,
        path=settings.secret_file,
        on_problem=lambda message: logger.warning("Disk KV tier: %s", message),
    )
    logger.info("Disk KV tier: block files %s.", source.keys().describe())
    return source
