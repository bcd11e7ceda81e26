"""Scheduler side: finished requests whose L1 blocks wait for room in the pool.

Runs in the engine-core process, inside the connector's scheduler side
(connector.py), and only decides: for each request id, when the L1 blocks
of a finished request may be freed. The connector sends the ids it releases
to the worker in the step's metadata; the worker reports them back as
``finished_sending``, and that is when vLLM's scheduler frees the blocks.

Why hold: vLLM's pool manager gives a store all the rows it needs or none
(``prepare_store`` returns None while the rows it would evict are pinned by
copies in flight). A running request retries on its next step; a finished
one has no next step, and its blocks go back to L1's free list to be
overwritten, so its unstored blocks would be lost.

The rules, per finished request:

- Hold only if a chunk is left to store, no load is in flight (vLLM frees a
  request aborted during a load itself, when the load ends) and the chunks
  can fit at all: a store takes all its rows at once, so more chunks than
  the pool has rows never fit (``TOO_BIG``: freed at once, counted dropped).
- Retry every step (the connector tries held stores before running ones).
- Release as soon as nothing is left to store (stored, or handed to a copy
  in flight: vLLM's fences make a reuse of the block wait for that copy).
- Give up, release and count the blocks as dropped, when a retry fails and
  nothing in flight can unpin a row, or after ``MAX_BUSY_STEPS`` steps that
  scheduled tokens. Only busy steps count: on them L1 is in demand; idle
  steps cost nobody anything and the copies in flight end within
  milliseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

# A store frees its rows two steps after it is prepared (copied at the start
# of the next step, completed at its end), so eight busy steps let about
# four finished requests that wait for the same rows through in turn. Past
# that the pool is saturated by new traffic, and L1 blocks are worth more
# than a copy in L2.
MAX_BUSY_STEPS = 8


class AtFinish(enum.Enum):
    FREE = "free"  # nothing to store, or a load in flight: free the blocks now
    HOLD = "hold"  # keep the blocks until the chunks are stored
    TOO_BIG = "too_big"  # more chunks than pool rows: free now, count them dropped


class HoldOutcome(enum.Enum):
    STORED = "stored"  # nothing left to store: release
    WAITING = "waiting"  # keep holding, retry next step
    DROPPED = "dropped"  # gave up: release, count the blocks dropped


class HoldUpdate(NamedTuple):
    outcome: HoldOutcome
    retry: bool  # this step's attempt repeated a failed one
    reason: str = ""  # why the blocks were dropped, for the log


@dataclass
class _Hold:
    attempts: int = 0
    busy_steps: int = 0


class Holds:
    def __init__(self, pool_rows: int, max_busy_steps: int = MAX_BUSY_STEPS):
        self.pool_rows = pool_rows
        self.max_busy_steps = max_busy_steps
        self._holds: dict[str, _Hold] = {}  # insertion order: oldest first

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._holds

    def held(self) -> list[str]:
        """Held request ids, oldest first: the first to be offered rows."""
        return list(self._holds)

    def on_finished(self, req_id: str, unstored: int, loading: bool) -> AtFinish:
        if unstored <= 0 or loading:
            return AtFinish.FREE
        if unstored > self.pool_rows:
            return AtFinish.TOO_BIG
        self._holds[req_id] = _Hold()
        return AtFinish.HOLD

    def update(self, req_id: str, unstored: int, busy: bool, in_flight: bool) -> HoldUpdate:
        """The outcome of this step's store attempt for a held request.

        ``unstored``: chunks still not handed to a store after the attempt;
        ``busy``: the step scheduled tokens; ``in_flight``: some transfer
        is still running, so a pinned row may come free.
        """
        hold = self._holds[req_id]
        hold.attempts += 1
        hold.busy_steps += busy
        retry = hold.attempts > 1
        if unstored <= 0:
            del self._holds[req_id]
            return HoldUpdate(HoldOutcome.STORED, retry)
        if not in_flight:
            del self._holds[req_id]
            return HoldUpdate(
                HoldOutcome.DROPPED, retry, "no transfer in flight can free a pool row"
            )
        if hold.busy_steps >= self.max_busy_steps:
            del self._holds[req_id]
            return HoldUpdate(
                HoldOutcome.DROPPED, retry, f"the pool had no room for {hold.busy_steps} busy steps"
            )
        return HoldUpdate(HoldOutcome.WAITING, retry)

    def drain(self) -> list[str]:
        """Forget every hold (the cache was reset); the ids to release."""
        ids = list(self._holds)
        self._holds.clear()
        return ids
