"""L3 I/O threads: a few daemon threads running the disk tier's block tasks.

Engine-core process. The disk tier (scheduler thread) submits one task per
block file (io_tasks.py); a few threads run them and put each ``Outcome`` on
a queue that the scheduler thread drains (completion.py).

Loads run before deletes, deletes before stores: a restore is on some
request's time-to-first-token, a delete frees the room a store waits for,
and a store is a background copy of bytes that are still in L2.

Threads: several reads in flight keep the disk's queue full while other
threads checksum (the checksum and the syscalls release the GIL). Measured
here (2 cores shared with other work, virtio disk, 360 KiB blocks, page
cache dropped, checksums on) with format version 1's zlib.crc32: 1 thread
restored 0.6-0.7 GB/s, 2 threads 0.9-1.0, 4 threads 1.0-1.4, 8 threads
1.0-1.6, 16 threads 0.9-1.5. Past 4 the restore was bound by CPU (about
220 us per block: 90 crc32, 70 kernel, the rest Python), not by the disk;
8 keep a faster disk (NVMe) busy too. Version 2's CRC-32C checks such a
block in 15-30 us at its measured speed (block_file.py), not yet measured
in a restore.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from vllm_uma.kv_offload.disk.io_descriptors import BlockIO, Outcome, StoreFailure, failed

DEFAULT_IO_THREADS = 8
# The longest a stop waits for the I/O threads to finish the file they are on.
SHUTDOWN_TIMEOUT_S = 5.0


class Priority(IntEnum):
    LOAD = 1
    DELETE = 2
    STORE = 3
    STOP = 4  # after every store queued before it: a stop drains them


class IOPool:
    """A few daemon threads running tasks by Priority, FIFO within one."""

    def __init__(self, num_threads: int, outcomes: queue.SimpleQueue, name: str):
        if num_threads < 1:
            raise ValueError(f"io_threads={num_threads} is invalid: it must be >= 1")
        self._tasks: queue.PriorityQueue = queue.PriorityQueue()
        self._outcomes = outcomes
        self._seq = itertools.count()  # FIFO among equal priorities
        # Set by shutdown: stores queued until then are written until this
        # time (monotonic), loads no longer run (no request waits for them).
        self._drain_until: float | None = None
        self._lock = threading.Lock()
        self._dropped: dict[Priority, int] = {}
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, priority: Priority, task: Callable[[BlockIO], Outcome | None], io: BlockIO
    ) -> None:
        self._tasks.put((priority, next(self._seq), task, io))

    def _run(self) -> None:
        while True:
            priority, _, task, io = self._tasks.get()
            try:
                if priority is Priority.STOP:
                    return
                if self._drop(priority):
                    continue
                try:
                    outcome = task(io)
                except Exception as exc:  # a bug must still end its job
                    outcome = failed(io, StoreFailure.IO_ERROR, repr(exc))
                if outcome is not None:
                    self._outcomes.put(outcome)
            finally:
                self._tasks.task_done()

    def _drop(self, priority: Priority) -> bool:
        """Whether a task dequeued during a stop is left undone (counted)."""
        until = self._drain_until
        if until is None or (priority is not Priority.LOAD and time.monotonic() < until):
            return False
        with self._lock:
            self._dropped[priority] = self._dropped.get(priority, 0) + 1
        return True

    def wait_idle(self) -> None:
        """Block until every submitted task has run and put its outcome."""
        self._tasks.join()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> "PoolStopped":
        """Stop the threads once every store queued before now is written,
        for up to ``timeout_s`` in all; queued loads are dropped (nobody
        waits for them now), and so are the stores still queued at the
        deadline (a dropped store leaves no file, a temp file at most). A
        thread stuck in the kernel on a file (a hung network mount) is left
        behind, a daemon that dies with the process."""
        deadline = time.monotonic() + timeout_s
        # A store takes milliseconds: none starts in the last 10% of the
        # wait, so that the ones in hand can finish before the join gives up.
        self._drain_until = deadline - 0.1 * timeout_s
        for _ in self._threads:
            self._tasks.put((Priority.STOP, next(self._seq), None, None))
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread in self._threads)
        # Dropped tasks hold slices of the primary rows: let them go, or the
        # primary tier's mmap cannot be closed.
        with self._lock:
            dropped = dict(self._dropped)
        while True:
            try:
                priority, _, _, _ = self._tasks.get_nowait()
            except queue.Empty:
                return PoolStopped(stuck, dropped)
            if priority is not Priority.STOP:
                dropped[priority] = dropped.get(priority, 0) + 1
            self._tasks.task_done()


@dataclass(frozen=True)
class PoolStopped:
    stuck_threads: int
    dropped: dict[Priority, int]
