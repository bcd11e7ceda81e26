"""A lower tier's threads: daemon threads running its work by priority.

Engine-core process. The tier (scheduler thread) submits one piece of
work at a time (the disk tier: one block file; the network tier: one vLLM
job) with its ``Priority``; the threads run it and put what it returns on
a queue that the scheduler thread drains (``drain``), so the tier's state
changes on one thread only. What a tier supplies: the task that does the
work (it may block: a disk read, a socket), the result a task that raised
still gives (``failed``: a bug must still end its job), the result of a
piece dropped at a stop (``dropped``; None: none), the number of threads
and how many of them run loads only.

Order: loads before deletes, deletes before stores, first in first out
within one. A load is on some request's time to first token, a delete
frees the room a store waits for, and a store is a background copy of
bytes that are still in the host pool. A priority alone cannot keep a
load from waiting behind stores already running: every thread may be in
one, and a store to a slow medium holds its thread for a while. So the
first ``load_only`` threads run loads only; with one of them a load waits
only for the loads before it (the network tier's choice, whose store can
hold a thread for a timeout per batch). Without one, every thread takes
every kind of work (the disk tier's: a store there takes milliseconds).

A stop (``shutdown``) runs the stores and deletes queued before it, for
up to its deadline in all; loads still queued are dropped at once (no
request waits for them now), and so is the rest at the deadline: no new
piece starts in its last 10%, so that the ones in hand can end before the
join gives up. A thread stuck in the kernel (a hung mount, a socket) is
left behind, a daemon that dies with the process; the stop says how many.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Generic, TypeVar

# The longest a stop waits for the work queued before it.
SHUTDOWN_TIMEOUT_S = 5.0

Item = TypeVar("Item")
Task = Callable[[Any], Any]  # an item -> its result, or None for no result


class Priority(IntEnum):
    """What a piece of work is, in the order the threads take it."""

    LOAD = 1
    DELETE = 2
    STORE = 3


_LOADS = (Priority.LOAD,)  # what a load-only thread takes
_ALL = tuple(Priority)  # in order: a thread takes the first kind queued


@dataclass(frozen=True)
class Stopped:
    stuck_threads: int  # still busy at the deadline
    dropped: dict[Priority, int]  # pieces left undone, by priority


class TierThreads(Generic[Item]):
    """``num_threads`` daemon threads named ``{name}-{i}``; the first
    ``load_only`` of them run loads only. ``setting`` names the count in
    the refusal of too few (the tier's own word for it)."""

    def __init__(
        self,
        name: str,
        num_threads: int,
        results: queue.SimpleQueue,
        failed: Callable[[Item, Exception], Any],
        dropped: Callable[[Item], Any] | None = None,
        load_only: int = 0,
        setting: str = "num_threads",
    ):
        if num_threads <= load_only:
            rule = f"{load_only} thread(s) run loads only and at least one more runs the rest"
            raise ValueError(
                f"{setting}={num_threads} is invalid: it must be >= {load_only + 1}"
                + (f" ({rule})" if load_only else "")
            )
        self._results = results
        self._failed = failed
        self._dropped_result = dropped
        self._queued = {priority: collections.deque() for priority in Priority}
        self._lock = threading.Lock()
        # One condition per kind of thread: a submit wakes one thread of
        # each kind that can take it, not every thread.
        self._wake = {kind: threading.Condition(self._lock) for kind in (_LOADS, _ALL)}
        self._idle = threading.Condition(self._lock)
        self._unfinished = 0  # submitted, result not put yet
        self._stopping = False
        # Set by shutdown: other work queued until then runs until this time
        # (monotonic), loads no longer run (no request waits for them).
        self._drain_until: float | None = None
        self._dropped: collections.Counter[Priority] = collections.Counter()
        self._threads = [
            threading.Thread(
                target=self._loop,
                args=(_LOADS if i < load_only else _ALL,),
                name=f"{name}-{i}",
                daemon=True,
            )
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: Priority, task: Callable[[Item], Any], item: Item) -> None:
        with self._lock:
            self._queued[priority].append((task, item))
            self._unfinished += 1
            for kind, wake in self._wake.items():
                if priority in kind:
                    wake.notify()

    def _next(self, kind: tuple[Priority, ...]) -> tuple[Priority, Task, Item] | None:
        """The next piece for a thread of ``kind``, or None once stopping
        leaves it nothing to run."""
        with self._lock:
            while True:
                for priority in kind:
                    if self._queued[priority]:
                        return (priority, *self._queued[priority].popleft())
                if self._stopping:
                    return None
                self._wake[kind].wait()

    def _loop(self, kind: tuple[Priority, ...]) -> None:
        while (piece := self._next(kind)) is not None:
            priority, task, item = piece
            try:
                if self._drops(priority):
                    result = None if self._dropped_result is None else self._dropped_result(item)
                else:
                    try:
                        result = task(item)
                    except Exception as exc:  # a bug must still end its job
                        result = self._failed(item, exc)
                if result is not None:
                    self._results.put(result)
            finally:
                with self._lock:
                    self._unfinished -= 1
                    if not self._unfinished:
                        self._idle.notify_all()

    def _drops(self, priority: Priority) -> bool:
        """Whether a piece dequeued during a stop is left undone (counted)."""
        until = self._drain_until
        if until is None or (priority is not Priority.LOAD and time.monotonic() < until):
            return False
        with self._lock:
            self._dropped[priority] += 1
        return True

    def wait_idle(self) -> None:
        """Block until every submitted piece has run and put its result."""
        with self._lock:
            while self._unfinished:
                self._idle.wait()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> Stopped:
        deadline = time.monotonic() + timeout_s
        self._drain_until = deadline - 0.1 * timeout_s
        with self._lock:
            self._stopping = True
            for wake in self._wake.values():
                wake.notify_all()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread in self._threads)
        # What no thread took holds slices of the primary rows: let it go,
        # or the primary tier's mmap cannot be closed.
        with self._lock:
            dropped = collections.Counter(self._dropped)
            for priority, pieces in self._queued.items():
                dropped[priority] += len(pieces)
                self._unfinished -= len(pieces)
                pieces.clear()
            if not self._unfinished:
                self._idle.notify_all()
        return Stopped(stuck, {priority: n for priority, n in dropped.items() if n})


def drain(results: queue.SimpleQueue) -> Iterator[Any]:
    """Scheduler thread: the results put so far, oldest first."""
    while True:
        try:
            yield results.get_nowait()
        except queue.Empty:
            return
