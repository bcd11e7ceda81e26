"""L3: what other servers did to the shared store, brought to this one.

A thread of the engine-core process, beside the I/O threads. Every
FEED_INTERVAL_S it
- writes the touches the scheduler thread queued (blocks hit or restored:
  the ledger's LRU order), in one transaction;
- reads the ledger's changes since the last it saw, keeps those of this
  tier's namespace made by other writers (our own the tier applied already),
  and puts one ``FeedBatch`` on the tier's outcome queue, so the scheduler
  thread applies them to its index with the I/O outcomes, never waiting on
  the ledger itself;
- every PINS_EVERY_S, reads the keys live pins of its namespace hold
  (pins/book.py) into ``pinned``, a frozenset replaced whole (the host
  pool's cache policy reads it on the scheduler thread, no lock), and now
  and then removes pins whose time is up.

A reader that fell behind the ledger's pruning (changes are kept
CHANGES_KEPT_S) gets a full snapshot of its namespace instead.

The scheduler thread's only calls are ``touch`` (a dict update under a lock)
and, when it may block anyway (a drain, a stop), ``flush``.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field

from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.pins import book
from vllm_uma.log import get_logger

logger = get_logger(__name__)

FEED_INTERVAL_S = 0.1
CHANGES_KEPT_S = 600.0
_PRUNE_EVERY_S = 60.0
# A pin made or removed through any server reaches the host pool's policy
# within this long (the disk tier's own victims skip pins at once: the
# ledger's query).
PINS_EVERY_S = 1.0


@dataclass
class FeedBatch:
    """Another server's changes to our namespace, in ledger order."""

    changes: list[tuple[bytes, int, bool]] = field(default_factory=list)  # key, size, added
    # Set when changes were missed: the namespace's whole present set.
    snapshot: list[tuple[bytes, int]] | None = None
    used_bytes: int | None = None


class LedgerFeed:
    def __init__(
        self,
        ledger: Ledger,
        namespace: bytes,
        writer: str,
        seq: int,
        outcomes: queue.SimpleQueue,
        interval_s: float = FEED_INTERVAL_S,
    ):
        self._ledger = ledger
        self._ns = namespace
        self._writer = writer
        self._seq = seq
        self._outcomes = outcomes
        self._interval_s = interval_s
        self._flushing = threading.Lock()  # one flush at a time (it may wait)
        self._touch_lock = threading.Lock()  # held for a dict update only
        self._touches: dict[BlockRef, int] = {}
        self._used: int | None = None
        self._stop = threading.Event()
        self._last_prune = time.monotonic()
        self._failed = False
        self.pinned: frozenset[bytes] = frozenset()
        self.pinned_on_disk: tuple[int, int] = (0, 0)  # blocks, bytes (a metric)
        self._pins_read = -PINS_EVERY_S
        self._thread = threading.Thread(target=self._run, name="uma-kv-ledger", daemon=True)
        self._thread.start()

    def touch(self, ref: BlockRef, stamp: int) -> None:
        """Scheduler thread: ``ref`` was used at ``stamp``."""
        with self._touch_lock:
            self._touches[ref] = stamp

    def is_touched(self, ref: BlockRef) -> bool:
        """Used, not yet in the ledger: no store may evict it meanwhile
        (a lookup's HIT is loaded at the end of the step)."""
        return ref in self._touches

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.flush()

    def flush(self) -> None:
        """Write touches, read changes (feed thread; a drain's caller too)."""
        with self._flushing:
            try:
                self._ledger.retry_deferred()
                self._write_touches()
                batch = self._read_changes()
                if time.monotonic() - self._pins_read >= PINS_EVERY_S:
                    self._pins_read = time.monotonic()
                    self.pinned = book.live_keys(self._ledger, self._ns)
                    self.pinned_on_disk = book.pinned_on_disk(self._ledger, self._ns)
                if time.monotonic() - self._last_prune > _PRUNE_EVERY_S:
                    self._last_prune = time.monotonic()
                    self._ledger.prune_changes(CHANGES_KEPT_S)
                    book.prune_expired(self._ledger)
            except sqlite3.Error as exc:
                # Busy past the timeout, or the disk is full: the touches are
                # kept for the next try; the index stays as it is meanwhile.
                if not self._failed:
                    self._failed = True
                    logger.warning(
                        "Disk KV tier: the shared ledger %s could not be read or "
                        "written (%s); retrying. Blocks other servers store are "
                        "not seen until it can.",
                        self._ledger.path,
                        exc,
                    )
                return
            self._failed = False
        if batch.changes or batch.snapshot is not None or batch.used_bytes is not None:
            self._outcomes.put(batch)  # only when something changed

    def _write_touches(self) -> None:
        with self._touch_lock:
            touches = dict(self._touches)
        if not touches:
            return
        self._ledger.touch(touches)
        with self._touch_lock:
            for ref, stamp in touches.items():  # keep those touched again since
                if self._touches.get(ref) == stamp:
                    del self._touches[ref]

    def _read_changes(self) -> FeedBatch:
        batch = FeedBatch()
        used = self._ledger.used_bytes()
        if used != self._used:
            self._used = batch.used_bytes = used
        changes, gap = self._ledger.changes_since(self._seq)
        if gap:
            batch.snapshot, self._seq = self._ledger.snapshot(self._ns)
            return batch
        for change in changes:
            self._seq = change.seq
            if change.ref.namespace != self._ns or change.writer == self._writer:
                continue
            batch.changes.append((change.ref.key, change.size, change.added))
        return batch

    def stop(self, timeout_s: float) -> None:
        """Stop the thread; a last flush writes the touches (the LRU order a
        restart finds). Waits at most ``timeout_s``."""
        self._stop.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive() and self._flushing.acquire(timeout=timeout_s):
            try:
                self._ledger.retry_deferred()
                self._write_touches()
            except sqlite3.Error:
                pass  # the order is a hint: a stop does not wait for it
            finally:
                self._flushing.release()
