"""L3 start-up: open a store for a disk tier, and find what it holds already.

Engine-core process, once, while vLLM builds the tier (before serving), so
blocking I/O is fine here: the namespace's directories, the O_DIRECT probe,
the shared ledger (created, or a damaged one moved aside), the scan of the
block files, the ledger reconciled with them and brought within the cap,
then this namespace's blocks into the tier's index. The tier's shutdown
closes the store again (``OpenStore.close``). On a full volume the ledger
cannot be written: the tier then starts with the blocks the ledger lists,
and the reconcile and the eviction (``settle``) run later, on an I/O
thread, once stores find space (full_disk.py).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk.block_file import file_bytes
from vllm_uma.kv_offload.disk.block_write import DIRECT_ALIGN, is_direct_capable, probe_direct
from vllm_uma.kv_offload.disk.full_disk import DeferredSettle
from vllm_uma.kv_offload.disk.index import DiskIndex
from vllm_uma.kv_offload.disk.io_tasks import unlinker
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.db import LEDGER_FILE, is_disk_full
from vllm_uma.kv_offload.disk.ledger.startup import (
    open_ledger,
    patiently,
    reconcile,
    unwritable_ledger,
)
from vllm_uma.kv_offload.disk.reports import DiskWarnings, log_startup
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.disk.store_scan import scan_store
from vllm_uma.kv_offload.disk.trust import StoreTrustError
from vllm_uma.kv_offload.lower_tier.reports import TierReports


@dataclass(frozen=True)
class OpenStore:
    """A store opened for one tier: its files, its ledger, and the primary
    tier's rows the blocks move between."""

    layout: Layout
    ledger: Ledger
    # This tier's name in the shared ledger: its own changes come back
    # through the feed and are skipped.
    writer: str
    rows: memoryview  # row c = bytes [c*row_bytes, (c+1)*row_bytes)
    row_bytes: int
    direct: bool  # O_DIRECT: aligned rows and a file system that takes it
    file_bytes: int  # one block file's size on disk

    def row(self, chunk: Any) -> memoryview:
        start = int(chunk) * self.row_bytes
        return self.rows[start : start + self.row_bytes]

    def close(self) -> None:
        """At the tier's shutdown, once no I/O thread is left: the ledger,
        the root handle, and the rows, which the primary tier then unmaps."""
        self.ledger.close()
        self.layout.close()
        self.rows.release()


def open_store(
    settings: DiskTierSettings,
    namespace_id: bytes,
    namespace_info: dict[str, Any],
    primary_kv_view: memoryview,
    row_bytes: int,
    warnings: DiskWarnings,
) -> OpenStore:
    layout = Layout(settings.root_dir)
    untrusted = layout.untrusted()
    if untrusted is not None:
        layout.close()
        raise StoreTrustError(untrusted)
    error = layout.prepare(namespace_id, namespace_info)
    if error is not None:
        warnings.namespace_file(error)
    rows = primary_kv_view.cast("B")
    direct = (
        row_bytes % DIRECT_ALIGN == 0
        and is_direct_capable(rows)
        and probe_direct(layout.namespace_dir(namespace_id))
    )
    writer = f"{os.getpid()}-{secrets.token_hex(4)}"
    path = layout.noindex / LEDGER_FILE
    ledger = patiently(lambda: open_ledger(layout, warnings), "start-up", path, warnings)
    return OpenStore(layout, ledger, writer, rows, row_bytes, direct, file_bytes(row_bytes))


@dataclass(frozen=True)
class Existing:
    """What the store held for this tier when it started."""

    seq: int  # the ledger's last change the index includes: the feed's start
    used_bytes: int  # the store's bytes, all servers
    settled: bool  # False: a full disk put the reconcile off (full_disk.py)


@dataclass(frozen=True)
class Settled:
    found: int  # block files the scan found, every namespace
    temps: int  # leftover temp files it removed
    evicted: list[tuple[BlockRef, int]]  # present blocks evicted to the cap


def settle(
    store: OpenStore,
    cap_bytes: int | None,
    writer: str,
    protected: Callable[[BlockRef], bool],
    warnings: DiskWarnings,
    live_writer: str | None = None,
) -> Settled:
    """The store's files and its ledger made to agree, then brought within
    the cap: at start-up, or later (full_disk.py). Raises SQLite's error
    when the volume is full (ledger.db.is_disk_full)."""
    found, temps = scan_store(store.layout.noindex)
    path = store.ledger.path
    patiently(
        lambda: reconcile(store.ledger, found, store.layout.exists, writer, live_writer),
        "reconcile",
        path,
        warnings,
    )
    errors: list[str] = []
    victims = patiently(
        lambda: store.ledger.evict_to_cap(  # the cap may have been lowered
            cap_bytes, writer, protected, unlinker(store.layout, errors)
        ),
        "eviction to the cap",
        path,
        warnings,
    )
    for error in errors:
        warnings.unlink(error)
    return Settled(len(found), temps, victims)


def settle_later(
    store: OpenStore,
    cap_bytes: int | None,
    protected: Callable[[BlockRef], bool],
    warnings: DiskWarnings,
) -> DeferredSettle:
    """The settling a full disk put off at start-up, tried again once
    stores find space (full_disk.py), under a writer name of its own."""
    writer = store.writer
    return DeferredSettle(
        lambda: settle(
            store, cap_bytes, f"{writer}-settle", protected, warnings, live_writer=writer
        ),
        warnings,
    )


def load_existing(
    store: OpenStore,
    settings: DiskTierSettings,
    namespace_id: bytes,
    index: DiskIndex[BlockRef],
    reports: TierReports,
    warnings: DiskWarnings,
    io_threads: int,
) -> Existing:
    """Scan, reconcile and evict to the cap; this namespace's blocks into
    ``index``, announced as KV events; the start-up line logged. On a full
    volume the ledger cannot be written: the tier starts with the blocks the
    ledger has, and settles the store once it has space (full_disk.py)."""
    # A large store takes a while to walk: say so first (log_startup
    # then says what was found).
    warnings.scanning()
    try:
        done = settle(store, settings.cap_bytes, store.writer, lambda ref: False, warnings)
    except sqlite3.OperationalError as exc:
        if not is_disk_full(exc):
            raise unwritable_ledger(store.layout.root_dir, store.ledger.path, exc) from None
        warnings.settle_put_off(str(exc))
        done = None
    else:
        reports.stats.count(m.EVICTED_BLOCKS, len(done.evicted))
    present, seq = store.ledger.snapshot(namespace_id)
    for key, size in present:
        index.add_present(BlockRef(namespace_id, key), size)
    # Announce what this server can restore from the start (least recent
    # first), so that a KV-aware router learns it too.
    reports.event([key for key, _ in present], removed=False)
    used_bytes = store.ledger.used_bytes()
    io = f"{'O_DIRECT' if store.direct else 'buffered'} I/O on {io_threads} threads"
    if done is not None:
        evicted = len(done.evicted)
        log_startup(
            reports, settings, done.found, len(present), used_bytes, evicted, done.temps, io
        )
    return Existing(seq, used_bytes, settled=done is not None)
