"""L3 start-up: open the shared ledger, make it agree with the block files.

Runs once in the engine-core process when the disk tier is built (before
serving), after the store's scan (store_scan.py). The files are the truth: the ledger may
be new (an older store, or one removed by hand), or behind (blocks deleted
by hand, a server killed between a file's rename and its commit, a power
loss that lost the last commits).

Other servers may be using the store meanwhile, so everything is decided
inside one write transaction: no peer can commit while we compare. The
scan ran before it, so what it saw may be stale either way: a file it missed
because a peer renamed it just after is looked up again by name before its
row is removed, and a file it saw that a peer evicted since (row and file
gone) is looked up again before a row is added for it, or it would come
back as a phantom block every server then tries to restore.

Servers of a fleet start at once on one store, and a reconcile of a large
store holds the write lock for seconds to minutes, past the 10 s a store
waits (db.BUSY_TIMEOUT_S). The start-up steps therefore run
:func:`patiently`: retried while the lock is held, said once in the log, up
to STARTUP_WAIT_S; only then does the start fail, naming the ledger.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from vllm_uma.kv_offload.disk.block_file import pid_is_alive
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.db import (
    LEDGER_FILE,
    LedgerError,
    insert_block,
    is_disk_full,
    log_change,
)
from vllm_uma.kv_offload.disk.ledger.room import STALE_WRITE_S
from vllm_uma.kv_offload.disk.reports import DiskWarnings
from vllm_uma.kv_offload.disk.store_scan import FoundBlock

# How long a start-up step waits for another process's hold on the ledger:
# a reconcile of 10^6 rows takes about a minute on a slow disk.
STARTUP_WAIT_S = 600.0
T = TypeVar("T")


def patiently(step: Callable[[], T], what: str, path, warnings: DiskWarnings) -> T:
    """``step()``, tried again while SQLite says the ledger is locked or busy
    (another process's transaction), for up to STARTUP_WAIT_S."""
    deadline = time.monotonic() + STARTUP_WAIT_S
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if not _is_locked(exc):
                raise
            if time.monotonic() >= deadline:
                raise LedgerError(
                    f"the shared ledger {path} stayed locked for {STARTUP_WAIT_S:.0f} s while "
                    f"this server's {what} waited: another process holds it (`fuser {path}` "
                    f"names it). Stop that process, or give this server its own root_dir."
                ) from None
            warnings.ledger_busy(path, what, STARTUP_WAIT_S)


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def unwritable_ledger(root: Path, path: Path, exc: sqlite3.OperationalError) -> LedgerError:
    """A start-up that cannot write the ledger for another reason than a full
    disk or a lock (those have their own ways): a volume gone read-only
    (ext4's errors=remount-ro after an I/O error), or failing."""
    try:
        read_only = bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    state = "is mounted read-only" if read_only else "refuses writes"
    return LedgerError(
        f"the shared ledger {path} cannot be written ({exc}): the volume of {root} "
        f"{state}. The kernel log (dmesg) says why; after a repair (fsck), remount it "
        f"read-write, or give the disk tier a root_dir on another volume."
    )


def open_ledger(layout: Layout, warnings: DiskWarnings) -> Ledger:
    """The store's ledger, created if missing. A file SQLite cannot read
    (damaged, or not a database) is moved aside and started afresh: the
    block files are the truth, and ``reconcile`` rebuilds the rows."""
    ledger = Ledger(layout.noindex)
    try:
        ledger.create()
    except sqlite3.DatabaseError as exc:
        ledger.close()
        if isinstance(exc, sqlite3.OperationalError):
            if is_disk_full(exc):  # a new store on a full volume: nothing to start from
                raise LedgerError(
                    f"the volume of {layout.root_dir} is full: the shared ledger "
                    f"{ledger.path} cannot be created ({exc}). Free space on that volume, "
                    f"or give the disk tier a root_dir on another."
                ) from None
            if _is_locked(exc):
                raise  # patiently waits for its holder
            raise unwritable_ledger(layout.root_dir, ledger.path, exc) from None
        aside = ledger.path.with_name(f"{LEDGER_FILE}.damaged-{time.time_ns()}")
        os.rename(ledger.path, aside)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(ledger.path) + suffix)
        warnings.ledger_rebuilt(ledger.path, str(exc), aside)
        ledger = Ledger(layout.noindex)
        ledger.create()
    return ledger


@dataclass(frozen=True)
class Reconciled:
    added: int  # files the ledger did not know
    forgotten: int  # rows whose file is gone
    reclaimed: int  # writes abandoned by a dead process


def reconcile(
    ledger: Ledger,
    found: list[FoundBlock],
    exists: Callable[[BlockRef], bool],
    writer: str,
    live_writer: str | None = None,
) -> Reconciled:
    """Rows for every file found that is still there, no row for a file that
    is gone, and the used total recounted from the rows. ``exists`` is asked
    inside the transaction, so it is the truth where ``found`` may be stale.
    ``live_writer``: this process's tier whose rows are its writes in
    flight, when the reconcile runs after its start-up (full_disk.py);
    other rows of this pid are an earlier tier's, abandoned."""
    files = {block.ref: block for block in found}
    now = time.time()
    with ledger.transaction() as db:
        known, forgotten, reclaimed = _check_rows(db, files, exists, writer, live_writer, now)
        added = _add_unknown_files(db, files, known, exists, writer, now)
        _recount(db)
    return Reconciled(added, forgotten, reclaimed)


def _check_rows(
    db: sqlite3.Connection,
    files: dict[BlockRef, FoundBlock],
    exists: Callable[[BlockRef], bool],
    writer: str,
    live_writer: str | None,
    now: float,
) -> tuple[set[BlockRef], int, int]:
    """Every row against the files: the rows' blocks, and how many rows
    were forgotten (file gone) and reclaimed (a dead writer's, no file)."""
    rows = db.execute("SELECT ns, key, state, writer_pid, writer, since FROM blocks").fetchall()
    known = set()
    forgotten = reclaimed = 0
    for ns, key, state, pid, row_writer, since in rows:
        ref = BlockRef(ns, key)
        known.add(ref)
        if state != BlockState.PRESENT:
            # Being written or deleted: its owner finishes it. A gone
            # owner's file (renamed, or not yet unlinked) is a block.
            if live_writer is not None and row_writer == live_writer:
                continue  # ours, in flight now
            ours_before = pid == os.getpid()  # an earlier tier of this process
            if pid_is_alive(pid) and not ours_before and now - since < STALE_WRITE_S:
                continue
            size = files[ref].size if ref in files else 0
            reclaimed += _settle_unfinished(db, ref, exists(ref), size, writer)
        elif ref not in files and not exists(ref):
            db.execute("DELETE FROM blocks WHERE ns=? AND key=?", (ns, key))
            log_change(db, ref, 0, added=False, writer=writer)
            forgotten += 1
    return known, forgotten, reclaimed


def _settle_unfinished(
    db: sqlite3.Connection, ref: BlockRef, on_disk: bool, size: int, writer: str
) -> int:
    """A dead owner's write or delete: its file, if there, is a block;
    else the row goes. Returns 1 for a row reclaimed, else 0."""
    if on_disk:
        db.execute(
            "UPDATE blocks SET state=? WHERE ns=? AND key=?",
            (BlockState.PRESENT, ref.namespace, ref.key),
        )
        log_change(db, ref, size, added=True, writer=writer)
        return 0
    db.execute("DELETE FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key))
    return 1


def _add_unknown_files(
    db: sqlite3.Connection,
    files: dict[BlockRef, FoundBlock],
    known: set[BlockRef],
    exists: Callable[[BlockRef], bool],
    writer: str,
    now: float,
) -> int:
    """A row for every file the ledger did not know that is still there (a
    peer may have evicted it since the scan); how many were added."""
    added = 0
    for ref, block in files.items():
        if ref not in known and exists(ref):
            # No writer process: the file is complete, found on disk.
            insert_block(db, ref, block.size, BlockState.PRESENT, block.mtime_ns, writer, 0, now)
            log_change(db, ref, block.size, added=True, writer=writer)
            added += 1
    return added


def _recount(db: sqlite3.Connection) -> None:
    """The used and deleting totals, summed again from the rows."""
    db.execute(
        "UPDATE meta SET value=(SELECT coalesce(sum(size), 0) FROM blocks) WHERE name='used'"
    )
    db.execute(
        "UPDATE meta SET value=(SELECT coalesce(sum(size), 0) FROM blocks WHERE state=?) "
        "WHERE name='deleting'",
        (BlockState.DELETING,),
    )
