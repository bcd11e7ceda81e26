"""The network tier's transfer threads: a load never waits behind a store.

Engine-core process. The tier (scheduler thread) submits one ``Transfer``
per vLLM job; two daemon threads run them (transfers.py) and put each
``TransferDone`` on a queue the scheduler thread drains.

A load is on some request's time to first token; a store is a background
copy of bytes still in the host pool. So one thread runs loads only, and
the other runs a load first whenever one waits, else a store. A priority
queue alone (loads before stores) is not enough: both threads can be in
stores when a load comes, and a store to a slow engine holds its thread
for up to a timeout per batch (round_trips.py). With a thread of its own,
a load waits only for the loads before it, and its deadline runs from its
submission, so a load queued too long is a miss at once, not a late one.

Two threads, not more: a load can overlap a store, or another load, and
the sockets release the GIL; more would fight the server for this
machine's two cores.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from vllm_uma.kv_offload.network.transfers import Miss, Transfer, TransferDone, failed_all

TRANSFER_THREADS = 2
# The longest a stop waits for the stores queued before it.
SHUTDOWN_TIMEOUT_S = 5.0


class TransferThreads:
    def __init__(
        self,
        run: Callable[[Transfer], TransferDone],
        done,  # queue.SimpleQueue of TransferDone
        num_threads: int = TRANSFER_THREADS,
    ):
        if num_threads < 2:
            raise ValueError(
                f"num_threads={num_threads} is too few: one thread runs loads only and "
                f"at least one runs stores. Give 2 or more."
            )
        self._run = run
        self._done = done
        self._loads: collections.deque[Transfer] = collections.deque()
        self._stores: collections.deque[Transfer] = collections.deque()
        self._changed = threading.Condition()
        self._unfinished = 0  # submitted, result not put yet
        self._stopping = False
        self._drain_until: float | None = None  # set by shutdown
        self._threads = [
            threading.Thread(target=self._loop, args=(i > 0,), name=f"uma-kv-net-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, transfer: Transfer) -> None:
        with self._changed:
            (self._loads if transfer.is_load else self._stores).append(transfer)
            self._unfinished += 1
            self._changed.notify_all()

    def _next(self, takes_stores: bool) -> Transfer | None:
        """The next job for a thread (FIFO within loads and within stores),
        or None once stopping leaves it nothing to run."""
        with self._changed:
            while True:
                if self._loads:
                    return self._loads.popleft()
                if takes_stores and self._stores:
                    return self._stores.popleft()
                if self._stopping:
                    return None
                self._changed.wait()

    def _loop(self, takes_stores: bool) -> None:
        while (transfer := self._next(takes_stores)) is not None:
            try:
                if self._dropped(transfer):
                    # Every job still ends in one result: vLLM frees its rows then.
                    self._done.put(failed_all(transfer, Miss.ENGINE_DOWN))
                else:
                    self._done.put(self._run(transfer))
            finally:
                with self._changed:
                    self._unfinished -= 1
                    self._changed.notify_all()

    def _dropped(self, transfer: Transfer) -> bool:
        until = self._drain_until
        if until is None:
            return False
        return transfer.is_load or time.monotonic() >= until

    def wait_idle(self) -> None:
        """Block until every submitted job has run and put its result."""
        with self._changed:
            while self._unfinished:
                self._changed.wait()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> int:
        """Stop once the stores queued before now are sent, for up to
        ``timeout_s``; loads still queued are dropped (no request waits for
        them now). Returns the threads still busy at the deadline (stuck on
        a socket for at most a round trip's timeout; daemons)."""
        deadline = time.monotonic() + timeout_s
        self._drain_until = deadline - 0.1 * timeout_s
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(thread.is_alive() for thread in self._threads)
