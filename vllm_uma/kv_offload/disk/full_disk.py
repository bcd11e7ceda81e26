"""What the disk tier does when its volume is full: stores paused, the start-up's settling put off.

Only the kernel's ENOSPC or EDQUOT means full (io_tasks.py); a short
write or any other error fails one block. A full volume is rarely for ever:
the tier's own evictions free space, and so do other users of the volume.
So stores pause (each one would fail, slowly, as the file system searches
for space) and come back by themselves:

- a delete of ours completes: space was freed, stores resume at once;
- otherwise after a back-off (5 s, doubling to 60 s), stores are tried
  again; the first one to succeed ends the pause, another ENOSPC doubles
  the back-off.

``FullDisk``: scheduler thread of the engine core; no syscalls, only the clock.

At start-up a tier reconciles the shared ledger with the block files (a
crashed server's unfinished writes, files added or removed by hand) and
evicts to the cap (tier_startup.settle). Both write the ledger, which
SQLite refuses on a full volume ("database or disk is full"); the server
must start all the same, so load_existing starts the tier with the blocks
the ledger lists and leaves the rest to ``DeferredSettle``.

A crashed server's unfinished rows meanwhile still count in the store's
bytes (the cap holds) and still block their keys; so the settling is tried
again, on one of the tier's I/O threads (it walks the store: never on the
scheduler thread), when the scheduler thread is about to store and stores
are not paused, at most every RETRY_S. Its ledger changes carry a writer
name of their own, so the tier's feed applies them to its index as it
would a peer's reconcile, and the tier's own writes in flight are left
alone (reconcile's ``live_writer``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_uma.kv_offload.disk.ledger.db import is_disk_full
from vllm_uma.kv_offload.disk.reports import DiskWarnings
from vllm_uma.log import get_logger

if TYPE_CHECKING:  # tier_startup builds a DeferredSettle
    from vllm_uma.kv_offload.disk.tier_startup import Settled

logger = get_logger(__name__)

FIRST_RETRY_S = 5.0
MAX_RETRY_S = 60.0
# A put-off settling's tries: at most this often, while stores run.
RETRY_S = FIRST_RETRY_S


class FullDisk:
    def __init__(
        self,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._first = first_retry_s
        self._max = max_retry_s
        self._clock = clock
        self._full = False
        self._backoff = first_retry_s
        self._retry_at = 0.0

    @property
    def paused(self) -> bool:
        """Stores are held back right now."""
        return self._full and self._clock() < self._retry_at

    def on_full(self) -> bool:
        """A store met ENOSPC/EDQUOT. True if this starts a pause (log it)."""
        now = self._clock()
        if not self._full:
            self._full = True
            self._backoff = self._first
        elif now >= self._retry_at:
            # A retry failed: wait longer. Failures of stores sent before
            # the pause began do not count.
            self._backoff = min(self._backoff * 2, self._max)
        else:
            return False
        self._retry_at = now + self._backoff
        return self._backoff == self._first

    def on_space(self) -> bool:
        """A store succeeded or a delete freed space. True if this ends a
        pause (log it)."""
        if not self._full:
            return False
        self._full = False
        self._retry_at = 0.0
        return True

    @property
    def retry_in_s(self) -> float:
        return max(0.0, self._retry_at - self._clock())


class DeferredSettle:
    def __init__(
        self,
        settle: Callable[[], Settled],
        warnings: DiskWarnings,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pending = True  # read by the scheduler thread, cleared by the task
        self._settle = settle
        self._warnings = warnings
        self._retry_s = retry_s
        self._clock = clock
        self._running = False
        self._next_try = 0.0
        self._errors_logged = False

    def due(self) -> bool:
        """Scheduler thread: True if a try should be submitted now (then it
        counts as running until the task ends)."""
        now = self._clock()
        if not self.pending or self._running or now < self._next_try:
            return False
        self._running = True
        self._next_try = now + self._retry_s
        return True

    def run(self, _io: object = None) -> None:
        """I/O thread: one try. Never raises (the pool would report it as a
        failed block). Returns no outcome: nothing waits for it."""
        try:
            done = self._settle()
        except sqlite3.OperationalError as exc:
            if not is_disk_full(exc):  # still full: the next store's ask tries again
                self._log_error(exc)
        except Exception as exc:  # noqa: BLE001 - logged, tried again later
            self._log_error(exc)
        else:
            self.pending = False  # before running ends: no second try slips in
            self._warnings.settled_late(len(done.evicted))
        finally:
            self._running = False

    def _log_error(self, exc: Exception) -> None:
        if not self._errors_logged:
            self._errors_logged = True
            logger.warning(
                "Disk KV tier: bringing the ledger up to date with the block files failed "
                "(%r); tried again every %.0f s while stores run.",
                exc,
                self._retry_s,
            )
