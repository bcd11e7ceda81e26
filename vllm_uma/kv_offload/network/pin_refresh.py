"""Pinned blocks kept in the KV server: their access time refreshed (TOUCH).

Engine-core process. Pins live in the disk tier's ledger (pins/), whose
feed thread reads the keys live pins of the namespace hold
(disk/ledger/feed.py). The KV server evicts with ``allkeys-lru`` under
its maxmemory, TTL or not: a TTL-free key is not kept for being one, and
nothing in Valkey or Redis exempts one key from it (the ``volatile-*``
policies spare every key without a TTL, so every block of ours: the tier
warns of them). What its LRU honours is use, and TOUCH is a use that
sends no value back. So the tier touches the pinned blocks of its
namespace every ``PIN_REFRESH_S``:

    uma-kv-net-pins (a timer)            a transfer thread (uma-kv-net-1)
      every PIN_REFRESH_S:
      pinned_keys() -> the KV server's
      names (value_format.py)
      threads.submit(STORE, ...)   ----->  TOUCH, REFRESH_BATCH names a round
                                           trip, one command per slot,
                                           pipelined per node
                                           (round_trips.each_slot); all of
                                           it within PIN_REFRESH_S
                                           -> PinsRefreshed, on the results queue
    scheduler thread: get_finished_jobs counts it (tier.py, metrics.py)

Why so:
- A timer thread, not a scheduler hook: an idle engine core runs no
  scheduler steps, and an idle server's pins are exactly what other
  servers' traffic evicts.
- At the stores' priority, first in first out with them: it never delays
  a load (loads have a thread of their own) and is never starved by a
  backlog of stores, which comes when the KV server is busiest and so
  evicts most (a priority below the stores' would wait for all of them).
- One refresh in flight at a time: a slow or gone KV server gets no queue
  of them.
- TOUCH answers how many of its keys the KV server holds (a key it does
  not: evicted, or not stored there yet): the metrics say how many pinned
  blocks it still holds. A multi-key TOUCH where the slots allow: a
  standalone KV server answers 1000 names with one integer, which this
  process handles 3.5 times faster than 1000 replies (measured).

The limit, measured (docs/network_tier.md, "Pinned prefixes"): LRU keeps a
touched key only while the keys it evicts are older. The KV server's LRU
clock counts whole seconds and it picks victims from samples, so a KV
server that writes its whole maxmemory through in less than about four
refresh intervals (with pins an eighth of it; more with more) may evict
some pinned blocks all the same (the gauges say so). And it keeps them
from the LRU only: a ``FLUSHALL``, or a restart of a KV server without
persistence, removes them with the rest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vllm_uma.kv_offload.lower_tier.reports import TierReports
from vllm_uma.kv_offload.lower_tier.threads import Priority, TierThreads
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network import round_trips
from vllm_uma.kv_offload.network.server_link import ServerLink

# Touched every this often. Measured (docs/network_tier.md, "Pinned
# prefixes"): pinned blocks an eighth of maxmemory kept while the KV server
# takes at least 4 intervals to write its maxmemory through (8 s: a 4 GiB
# KV server written at up to 500 MB/s), many lost at 2; a larger pinned
# share needs a slower KV server. Cheap enough to be short: 10,000
# pinned blocks are 13 ms of a transfer thread per refresh on a standalone
# KV server (one TOUCH per 1000 names), 45 ms on a cluster (one per block).
PIN_REFRESH_S = 2.0
# Names per round trip: its replies are bounded by round_trips'
# SMALL_REPLY_BYTES each, so a round trip reads at most ~1 MB, and sends
# ~120 kB of names.
REFRESH_BATCH = 1000

PinnedKeys = Callable[[], frozenset[bytes]]


@dataclass(frozen=True, slots=True)
class Refresh:
    """One refresh, as the transfer thread sees it."""

    names: tuple[bytes, ...]  # the pinned blocks' names in the KV server


@dataclass(frozen=True, slots=True)
class PinsRefreshed:
    """What a refresh found, for the scheduler thread's metrics."""

    pinned: int  # blocks live pins hold
    present: int  # of them, held by the KV server (TOUCH answered 1)
    reached: bool  # False: every node was down, nothing was sent
    error: str | None = None  # a bug of ours ended it

    def report(self, reports: TierReports, block_bytes: int) -> None:
        """Scheduler thread: into the tier's metrics (metrics.py);
        ``block_bytes``: one block's payload."""
        reports.stats.gauge(m.PINNED_BLOCKS, self.present)
        reports.stats.gauge(m.PINNED_BYTES, self.present * block_bytes)
        reports.stats.gauge(m.PINNED_MISSING, self.pinned - self.present)
        if self.reached and self.pinned:  # the last pin gone: a 0, no refresh
            reports.stats.count(m.PIN_REFRESHES)
        if self.error is not None:
            why = "network KV tier: a pin refresh failed (%s); tried again."
            reports.warnings.warn("pin refresh", why, self.error)


def touch_all(link: ServerLink, names: tuple[bytes, ...], deadline: float) -> PinsRefreshed:
    """Transfer thread: TOUCH every name, ``REFRESH_BATCH`` a round trip,
    one TOUCH per slot (a standalone KV server: one for the batch; a
    cluster: one per block, as each block's name is a slot of its own),
    each round trip bounded by the link's timeout and all of them by
    ``deadline`` (time.monotonic()). TOUCH answers how many of its keys
    exist; a key whose node did not answer, or that the deadline cut,
    counts as not present: nobody kept it alive."""
    if link.fail_fast():
        return PinsRefreshed(len(names), 0, reached=False)
    present = 0
    for i in range(0, len(names), REFRESH_BATCH):
        if time.monotonic() >= deadline:
            break  # a slow KV server: the next refresh starts over
        batch = names[i : i + REFRESH_BATCH]
        for _, reply in round_trips.each_slot(link, batch, "TOUCH", "a pin refresh", deadline):
            if isinstance(reply, int):  # else an error: its names kept by nobody
                present += reply
    return PinsRefreshed(len(names), present, reached=True)


class PinRefresher:
    """The timer: every ``every_s``, one ``Refresh`` of the blocks
    ``pinned_keys()`` names, run by ``threads`` (the tier's), unless the
    last one is still out. ``name_of``: a key's name in the KV server."""

    def __init__(
        self,
        link: ServerLink,
        threads: TierThreads,
        pinned_keys: PinnedKeys,
        name_of: Callable[[bytes], bytes],
        every_s: float = PIN_REFRESH_S,
    ):
        self._link = link
        self._threads = threads
        self._pinned_keys = pinned_keys
        self._name_of = name_of
        self._every_s = every_s
        self._out = threading.Event()  # a refresh submitted, not run yet
        self._stop = threading.Event()
        self._keys: frozenset[bytes] = frozenset()
        self._names: tuple[bytes, ...] = ()
        self._thread = threading.Thread(target=self._run, name="uma-kv-net-pins", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            if self._out.is_set():
                continue  # a slow KV server: the last refresh is still running
            keys = self._pinned_keys()
            if not keys and not self._keys:
                continue  # no pins, and the metrics say so already
            if keys != self._keys:  # the feed hands a new set each read, mostly equal
                self._keys, self._names = keys, tuple(self._name_of(key) for key in keys)
            self._out.set()
            self._threads.submit(Priority.STORE, self.run, Refresh(self._names))

    def run(self, refresh: Refresh) -> PinsRefreshed | None:
        """The transfer thread's task; None (no result) once stopping. It
        never raises: the threads' ``failed`` is a transfer's."""
        try:
            if self._stop.is_set():
                return None
            # From its start, not its submission: a refresh that waited
            # behind stores still gets its whole interval.
            return touch_all(self._link, refresh.names, time.monotonic() + self._every_s)
        except Exception as exc:  # a bug: said, and the next refresh tries again
            return PinsRefreshed(len(refresh.names), 0, False, f"{type(exc).__name__}: {exc}")
        finally:
            self._out.clear()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
