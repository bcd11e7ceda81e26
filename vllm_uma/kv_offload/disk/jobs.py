"""L3: one vLLM transfer job in flight on the disk tier, until its JobResult.

Scheduler thread of the engine-core process. A job (lower_tier/jobs.py) is
one task per block on the I/O threads (io_tasks.py); it ends when the last
block's outcome has been applied, or at once when no block needed I/O (all
skipped or refused). Besides the shared ``Job``, a disk job keeps what its
loads pinned and when it gives up on those no I/O thread has started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey

from vllm_uma.kv_offload.disk.io_descriptors import Outcome, Ticket
from vllm_uma.kv_offload.lower_tier.jobs import Job


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
