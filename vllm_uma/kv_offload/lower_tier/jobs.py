"""A lower tier's vLLM transfer jobs in flight, until each one's JobResult.

Scheduler thread of the engine-core process. vLLM submits a store or a
load job (``TransferJob``: keys and primary-tier rows) and unpins the
job's rows only when it sees the job's ``JobResult``, so every job ends
in exactly one. A tier splits a job into parts for its threads (the disk
tier: one per block file; the network tier: one, the whole job), counts
each part's end in on the scheduler thread, and finishes the job when
its last part has ended, or at once when it has none (every key skipped
or refused before any I/O). What a tier keeps of its own: what a part's
outcome means (a bad file, a full KV server), and a subclass of ``Job`` for
what it tracks besides (the disk tier's load pins and deadlines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.tiering.base import JobResult


@dataclass
class Job:
    job_id: int
    keys: list[OffloadKey]  # in vLLM's (prefix) order
    is_load: bool
    pending: int = 0  # parts still on the tier's threads
    failed: list[OffloadKey] = field(default_factory=list)
    nbytes: int = 0  # payload bytes moved
    # The I/O's span (perf_counter seconds): the first part's start to the
    # last part's end, queueing excluded, so vLLM's bandwidth is the medium's.
    start: float = float("inf")
    end: float = 0.0

    def part_done(self, nbytes: int = 0, start: float = float("inf"), end: float = 0.0) -> bool:
        """One part's end counted in, with what it moved; True when it was
        the last."""
        self.nbytes += nbytes
        if nbytes:  # a part that moved nothing (a block already held) has no span
            self.start = min(self.start, start)
            self.end = max(self.end, end)
        self.pending -= 1
        return self.pending == 0

    def result(self) -> JobResult:
        time = self.end - self.start if self.nbytes else None
        if not self.failed:
            return JobResult(self.job_id, True, None, time, self.nbytes)
        failed = set(self.failed)
        loaded = [key for key in self.keys if key not in failed]
        if not self.is_load or not loaded:
            return JobResult(self.job_id, False, None, time, self.nbytes)
        # A partly failed load keeps the blocks it did restore.
        return JobResult(self.job_id, False, loaded, time, self.nbytes)


J = TypeVar("J", bound=Job)


class JobBook(Generic[J]):
    """The jobs in flight by id, and the results not yet handed to vLLM."""

    def __init__(self) -> None:
        self._in_flight: dict[int, J] = {}
        self._results: list[JobResult] = []

    def track(self, job: J) -> None:
        self._in_flight[job.job_id] = job

    def __getitem__(self, job_id: int) -> J:
        return self._in_flight[job_id]

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._in_flight

    def finish(self, job: J) -> None:
        del self._in_flight[job.job_id]
        self._results.append(job.result())

    def take_results(self) -> list[JobResult]:
        """The results of the jobs finished since the last take, in order."""
        results, self._results = self._results, []
        return results

    def has_pending_work(self) -> bool:
        return bool(self._in_flight or self._results)
