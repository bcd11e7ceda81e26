"""L3: one vLLM transfer job in flight on the disk tier, until its JobResult.

Scheduler thread of the engine-core process. A job is one task per block on
the I/O threads (io_threads.py); it ends when the last block's outcome has been
applied, or at once when no block needed I/O (all skipped or refused).
vLLM unpins the job's primary-tier rows only when it sees the JobResult, so
every job ends in exactly one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.tiering.base import JobResult

from vllm_uma.kv_offload.disk.io_descriptors import Outcome, Ticket


@dataclass
class PendingJob:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    pending: int = 0  # block tasks still on the I/O threads
    failed: list[OffloadKey] = field(default_factory=list)
    written: list[OffloadKey] = field(default_factory=list)  # stores, for the event
    serials: dict[OffloadKey, int] = field(default_factory=dict)  # load pins
    # Loads still without an outcome, and when the job gives up on those
    # that have not started (monotonic seconds; inf for stores).
    tickets: dict[OffloadKey, Ticket] = field(default_factory=dict)
    deadline: float = float("inf")
    nbytes: int = 0
    start: float = float("inf")
    end: float = 0.0

    def note(self, outcome: Outcome) -> bool:
        """Count one block's outcome in; True when it was the last."""
        self.tickets.pop(outcome.ref.key, None)
        if outcome.ok:
            self.nbytes += outcome.nbytes
            self.start = min(self.start, outcome.start)
            self.end = max(self.end, outcome.end)
        self.pending -= 1
        return self.pending == 0

    def give_up(self) -> list[OffloadKey]:
        """Past the deadline: the loads no I/O thread has started become
        misses; returns their keys (the caller counts them in)."""
        given_up = [key for key, ticket in self.tickets.items() if ticket.cancel()]
        for key in given_up:
            del self.tickets[key]
        return given_up

    def result(self) -> JobResult:
        # I/O time from the first block's start to the last block's end,
        # queueing excluded, so vLLM's read/write bandwidth is the disk's.
        time = self.end - self.start if self.nbytes else None
        if not self.failed:
            return JobResult(self.job_id, True, None, time, self.nbytes)
        if not self.is_load:
            return JobResult(self.job_id, False, None, time, self.nbytes)
        failed = set(self.failed)
        loaded = [key for key in self.keys if key not in failed]
        # A partly failed load keeps the blocks it did restore.
        return JobResult(self.job_id, False, loaded or None, time, self.nbytes)
