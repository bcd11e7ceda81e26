"""L3 I/O threads: a few daemon threads running the disk tier's block tasks.

Engine-core process. The disk tier (scheduler thread) submits one task per
block file (io_tasks.py); a few threads run them and put each ``Outcome`` on
a queue that the scheduler thread drains (completion.py).

Loads run before deletes, deletes before stores: a restore is on some
request's time-to-first-token, a delete frees the room a store waits for,
and a store is a background copy of bytes that are still in L2.

Threads: several reads in flight keep the disk's queue full while other
threads checksum (zlib.crc32 and the syscalls release the GIL). Measured
here (2 cores shared with other work, virtio disk, 360 KiB blocks, page
cache dropped, checksums on): 1 thread restored 0.6-0.7 GB/s, 2 threads
0.9-1.0, 4 threads 1.0-1.4, 8 threads 1.0-1.6, 16 threads 0.9-1.5. Past 4 the
restore is bound by CPU (about 220 us per block: 90 crc32, 70 kernel, the
rest Python), not by the disk; 8 keep a faster disk (NVMe) busy too.
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
    STOP = 0
    LOAD = 1
    DELETE = 2
    STORE = 3


class IOPool:
    """A few daemon threads running tasks by Priority, FIFO within one."""

    def __init__(self, num_threads: int, outcomes: queue.SimpleQueue, name: str):
        if num_threads < 1:
            raise ValueError(f"io_threads={num_threads} is invalid: it must be >= 1")
        self._tasks: queue.PriorityQueue = queue.PriorityQueue()
        self._outcomes = outcomes
        self._seq = itertools.count()  # FIFO among equal priorities
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
                try:
                    outcome = task(io)
                except Exception as exc:  # a bug must still end its job
                    outcome = failed(io, StoreFailure.IO_ERROR, repr(exc))
                if outcome is not None:
                    self._outcomes.put(outcome)
            finally:
                self._tasks.task_done()

    def wait_idle(self) -> None:
        """Block until every submitted task has run and put its outcome."""
        self._tasks.join()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> "PoolStopped":
        """Stop the threads after the tasks they are running; queued tasks
        are dropped (a dropped store leaves no file, a temp file at most).
        Waits at most ``timeout_s`` in all: a thread stuck in the kernel on
        a file (a hung network mount) is left behind, a daemon that dies
        with the process."""
        for _ in self._threads:
            self._tasks.put((Priority.STOP, next(self._seq), None, None))
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread in self._threads)
        # Dropped tasks hold slices of the primary rows: let them go, or the
        # primary tier's mmap cannot be closed.
        dropped: dict[Priority, int] = {}
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
