"""What the disk tier does when its volume is full: pause, retry, resume.

Only the kernel's ENOSPC or EDQUOT means full (io_tasks.py); a short
write or any other error fails one block. A full volume is rarely for ever:
the tier's own evictions free space, and so do other users of the volume.
So stores pause (each one would fail, slowly, as the file system searches
for space) and come back by themselves:

- a delete of ours completes: space was freed, stores resume at once;
- otherwise after a back-off (5 s, doubling to 60 s), stores are tried
  again; the first one to succeed ends the pause, another ENOSPC doubles
  the back-off.

Scheduler thread of the engine core; no syscalls, only the clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FIRST_RETRY_S = 5.0
MAX_RETRY_S = 60.0


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
