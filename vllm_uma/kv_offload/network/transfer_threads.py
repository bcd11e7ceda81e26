"""The network tier's transfer threads: jobs run by priority (loads first).

Engine-core process. The tier (scheduler thread) submits one ``Transfer``
per vLLM job; a few daemon threads run them (transfers.py) and put each
``TransferDone`` on a queue the scheduler thread drains. Loads go before
stores: a load is on some request's time to first token, a store is a
background copy of bytes still in the host pool.

Two threads: one load can overlap a store, and the sockets and the C reply
parser release the GIL; more would fight the server for this machine's two
cores (the engine's replies are parsed here, at 1-2.5 GB/s per thread).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from enum import IntEnum

from vllm_uma.kv_offload.network.transfers import Miss, Transfer, TransferDone, failed_all

TRANSFER_THREADS = 2
# The longest a stop waits for the stores queued before it.
SHUTDOWN_TIMEOUT_S = 5.0


class Priority(IntEnum):
    LOAD = 1
    STORE = 2
    STOP = 3  # after every store queued before it: a stop drains them


class TransferThreads:
    def __init__(
        self,
        run: Callable[[Transfer], TransferDone],
        done: queue.SimpleQueue,
        num_threads: int = TRANSFER_THREADS,
    ):
        self._run = run
        self._done = done
        self._tasks: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()  # FIFO within a priority
        self._drain_until: float | None = None  # set by shutdown
        self._threads = [
            threading.Thread(target=self._loop, name=f"uma-kv-net-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, transfer: Transfer) -> None:
        priority = Priority.LOAD if transfer.is_load else Priority.STORE
        self._tasks.put((priority, next(self._seq), transfer))

    def _loop(self) -> None:
        while True:
            priority, _, transfer = self._tasks.get()
            try:
                if priority is Priority.STOP:
                    return
                if self._dropped(priority):
                    # Every job still ends in one result: vLLM frees its rows then.
                    self._done.put(failed_all(transfer, Miss.ENGINE_DOWN))
                    continue
                self._done.put(self._run(transfer))
            finally:
                self._tasks.task_done()

    def _dropped(self, priority: Priority) -> bool:
        until = self._drain_until
        if until is None:
            return False
        return priority is Priority.LOAD or time.monotonic() >= until

    def wait_idle(self) -> None:
        """Block until every submitted job has run and put its result."""
        self._tasks.join()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> int:
        """Stop once the stores queued before now are sent, for up to
        ``timeout_s``; loads still queued are dropped (no request waits for
        them now). Returns the threads still busy at the deadline (stuck on
        a socket for at most its timeout; daemons)."""
        deadline = time.monotonic() + timeout_s
        self._drain_until = deadline - 0.1 * timeout_s
        for _ in self._threads:
            self._tasks.put((Priority.STOP, next(self._seq), None))
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(thread.is_alive() for thread in self._threads)
