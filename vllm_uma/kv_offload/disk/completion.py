"""L3: the I/O's outcomes applied on the scheduler thread, and jobs finished.

Scheduler thread of the engine-core process. The I/O threads (io_tasks.py)
and the ledger feed (ledger/feed.py) only report; vLLM's
``get_finished_jobs`` drains their reports here, so the index changes on one
thread and needs no lock. Every job vLLM submitted ends in exactly one
``JobResult``: when its last block's outcome is applied, at once when no
block needed I/O, or, for a load the I/O threads have not started in time,
when it is given up (a miss, recomputed).

A disk job (``PendingJob``) is the lower tier's ``Job`` (lower_tier/jobs.py)
with one part per block file on the I/O threads (io_tasks.py), and what
its loads pinned and when it gives up on those no I/O thread has started.
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.tiering.base import JobResult

from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk.block_file import BadReason, FileId
from vllm_uma.kv_offload.disk.full_disk import FullDisk
from vllm_uma.kv_offload.disk.index import BlockState, DiskIndex
from vllm_uma.kv_offload.disk.io_descriptors import Outcome, StoreFailure, Ticket
from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.ledger.feed import FeedBatch
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.disk.reports import BAD_BLOCK, DiskWarnings
from vllm_uma.kv_offload.lower_tier.jobs import Job, JobBook
from vllm_uma.kv_offload.lower_tier.reports import TierReports
from vllm_uma.kv_offload.lower_tier.threads import drain


@dataclass
class PendingJob(Job):
    written: list[OffloadKey] = field(default_factory=list)  # stores, for the event
    serials: dict[OffloadKey, int] = field(default_factory=dict)  # load pins
    # Loads still without an outcome, and when the job gives up on those
    # that have not started (monotonic seconds; inf for stores).
    tickets: dict[OffloadKey, Ticket] = field(default_factory=dict)
    deadline: float = float("inf")

    def note(self, outcome: Outcome) -> bool:
        """Count one block's outcome in; True when it was the last."""
        self.tickets.pop(outcome.ref.key, None)
        if outcome.ok:
            return self.part_done(outcome.nbytes, outcome.start, outcome.end)
        return self.part_done()

    def give_up(self) -> list[OffloadKey]:
        """Past the deadline: the loads no I/O thread has started become
        misses; returns their keys (the caller counts them in)."""
        given_up = [key for key, ticket in self.tickets.items() if ticket.cancel()]
        for key in given_up:
            del self.tickets[key]
        return given_up


class Completion:
    """The work in flight (jobs, deletes, load deadlines) and what ends it."""

    def __init__(
        self,
        namespace: bytes,
        index: DiskIndex[BlockRef],
        reports: TierReports,
        warnings: DiskWarnings,
        full: FullDisk,
        file_bytes: int,
        load_deadline_s: float,
        touch: Callable[[Iterable[OffloadKey]], None],
        delete_file: Callable[[BlockRef, FileId | None], None],
    ):
        self._ns = namespace
        self._index = index
        self._reports = reports
        self._warnings = warnings
        self._full = full
        self._file_bytes = file_bytes
        self._load_deadline_s = load_deadline_s
        self._touch = touch  # restored blocks, in prefix order
        self._delete_file = delete_file  # a bad block's file and row
        self._jobs: JobBook[PendingJob] = JobBook()
        self._loads_by_deadline: collections.deque[PendingJob] = collections.deque()
        self.deleting: dict[BlockRef, int] = {}  # deletes in flight per block
        self.used_bytes = 0  # the store's, all servers: the feed's last figure
        self.written_this_run = 0

    def has_pending_work(self) -> bool:
        return self._jobs.has_pending_work() or bool(self.deleting)

    def skip_reason(self, ref: BlockRef) -> str | None:
        """Why a store of ``ref`` writes nothing (the metric label), or None."""
        if ref in self.deleting:
            return "deleting"  # wait for the unlink, or it could hit the new file
        state = self._index.state(ref)
        return None if state is None else state.label

    def track(self, job: PendingJob) -> None:
        """A submitted job; a load with blocks to read gets its deadline."""
        if job.is_load and job.pending:
            job.deadline = time.monotonic() + self._load_deadline_s
            self._loads_by_deadline.append(job)
        self._jobs.track(job)
        if job.pending == 0:  # nothing to wait for: all skipped or failed
            self._finish(job)

    def store_failed(self, job: PendingJob, key: OffloadKey, reason: str) -> None:
        job.failed.append(key)
        self._reports.store_failed(reason)

    def finished_jobs(self, outcomes: queue.SimpleQueue) -> list[JobResult]:
        """Apply every report queued so far; the results of the jobs that ended."""
        for outcome in drain(outcomes):
            self._apply(outcome)
        self._give_up_late_loads()
        return self._jobs.take_results()

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
                self._reports.stats.count(m.LOADS_GIVEN_UP, len(late))
                self._warnings.late_loads(len(late), self._load_deadline_s)
            if job.pending == 0:
                self._finish(job)

    def _apply(self, outcome: Outcome | FeedBatch) -> None:
        if isinstance(outcome, FeedBatch):
            self._apply_feed(outcome)
            return
        if outcome.job_id is None:
            self._apply_delete(outcome)
            return
        job = self._jobs[outcome.job_id]
        if job.is_load:
            self._apply_load(job, outcome.ref, outcome)
        else:
            self._apply_store(job, outcome.ref, outcome)
        if job.note(outcome):
            self._finish(job)

    def _apply_delete(self, outcome: Outcome) -> None:
        ref = outcome.ref
        left = self.deleting.pop(ref) - 1
        if left:
            self.deleting[ref] = left
        if not outcome.ok:
            self._warnings.unlink(outcome.detail)
        elif outcome.freed and self._full.on_space():  # our delete freed room
            self._warnings.space_is_back()

    def _apply_store(self, job: PendingJob, ref: BlockRef, outcome: Outcome) -> None:
        self._reports.stats.count(m.EVICTED_BLOCKS, len(outcome.victims))
        self._evicted(outcome.victims)
        for error in outcome.unlink_errors:
            self._warnings.unlink(error)
        if outcome.taken is not None:
            # Another server stores (or stored) the same block: nothing to write.
            self._index.abort(ref)
            self._reports.store_skipped(reason=outcome.taken.label)
            if outcome.taken is BlockState.PRESENT:
                self._index.add_present(ref, self._file_bytes)
                job.written.append(ref.key)  # restorable from here too: announce
            return
        if outcome.ok:
            if self._full.on_space():
                self._warnings.space_is_back()
            self._index.commit(ref)
            self.written_this_run += 1
            job.written.append(ref.key)
            self._reports.moved(False, 1, outcome.nbytes)
            return
        self._index.abort(ref)
        self.store_failed(job, ref.key, outcome.failure.value)  # type: ignore[union-attr]
        self._store_error(outcome)

    def _store_error(self, outcome: Outcome) -> None:
        failure = outcome.failure
        if failure is StoreFailure.DISK_FULL:
            # Every store would fail the same way, and slowly (a full file
            # system searches for space): pause them (full_disk.py).
            if self._full.on_full():
                self._warnings.disk_full(outcome.detail, self._full.retry_in_s)
        elif failure is StoreFailure.LEDGER:
            self._warnings.ledger(outcome.detail)
        elif not isinstance(failure, Refusal):
            self._warnings.store_error(outcome.detail)

    def _evicted(self, victims: Iterable[BlockRef]) -> None:
        """Blocks whose rows and files a reservation of ours removed."""
        removed = [ref.key for ref in victims if self._index.remove(ref) is not None]
        self._reports.event(removed, removed=True)

    def _apply_feed(self, batch: FeedBatch) -> None:
        """Other servers' changes to our namespace, in the ledger's order."""
        if batch.used_bytes is not None:
            self.used_bytes = batch.used_bytes
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
                self._reports.stats.count(m.PEER_CHANGES, reason="added")
                self._reports.event([key], removed=False)
            elif not added and self._index.remove(ref) is not None:
                self._reports.stats.count(m.PEER_CHANGES, reason="removed")
                self._reports.event([key], removed=True)

    def _apply_load(self, job: PendingJob, ref: BlockRef, outcome: Outcome) -> None:
        serial = job.serials[ref.key]
        self._index.unpin(ref, serial)
        if outcome.ok:  # touched when the whole job ends, in prefix order
            self._reports.moved(True, 1, outcome.nbytes)
            return
        job.failed.append(ref.key)
        if not isinstance(outcome.failure, BadReason):
            # Our own code failed, not the file: recompute this time, keep the
            # block (only a file-level error deletes a file).
            self._warnings.load_error(outcome.detail)
            return
        reason = outcome.failure.value
        self._reports.bad(reason, 1, BAD_BLOCK, outcome.detail, reason, m.NAMES.bad_values)
        # Only the generation this load read: a newer store of the key stays.
        if self._index.remove(ref, serial) is not None:
            self._reports.event([ref.key], removed=True)
            # Out of the ledger too (a missing file's row would mislead every
            # server), and the file deleted in the same transaction.
            self._delete_file(ref, outcome.seen)

    def _finish(self, job: PendingJob) -> None:
        if job.is_load:
            failed = set(job.failed)
            self._touch([key for key in job.keys if key not in failed])
        written = set(job.written)  # announced in the job's (prefix) order
        self._reports.event([key for key in job.keys if key in written], removed=False)
        self._jobs.finish(job)
