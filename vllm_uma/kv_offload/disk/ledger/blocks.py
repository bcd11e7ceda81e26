"""L3 ledger: what stores, deletes and the feed do to the rows of blocks.

Engine-core processes: the I/O threads reserve, commit, abort and forget
(one short transaction each), the feed thread writes touches and reads
changes, start-up evicts to a lowered cap; the ``kv-store`` admin command
forgets what it deletes. Never the scheduler thread. The connection
plumbing is db.py's, the choice of victims room.py's; what the rows mean
and the invariants: the package docstring (__init__.py).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.ledger.db import LedgerDB, add_used, insert_block, log_change, used
from vllm_uma.kv_offload.disk.ledger.room import (
    Protected,
    Refusal,
    Victim,
    condemn,
    make_room,
)


class Change(NamedTuple):
    seq: int
    ref: BlockRef
    size: int
    added: bool
    writer: str


Unlink = Callable[[BlockRef], None]


class Ledger(LedgerDB):
    """The store's shared ledger, as every part of the disk tier uses it."""

    def __init__(self, noindex: Path):
        super().__init__(noindex)
        self._deferred_lock = threading.Lock()
        # Releases a failed transaction left, retried by the feed thread.
        self._deferred: list[Callable[[], None]] = []

    # -- stores (I/O threads) -------------------------------------------------

    def reserve(
        self,
        ref: BlockRef,
        size: int,
        stamp: int,
        cap: int | None,
        writer: str,
        protected: Protected,
        unlink: Unlink,
    ) -> list[tuple[BlockRef, int]] | Refusal | BlockState:
        """Add ``ref`` as being written, evicting least recent blocks to stay
        within ``cap``. Returns the victims (gone from the ledger, files
        unlinked), a Refusal with nothing changed, or the state of the row
        another store holds under that name (nothing to write)."""
        if cap is not None and size > cap:
            return Refusal.TOO_BIG
        with self.transaction() as db:
            row = db.execute(
                "SELECT state FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key)
            ).fetchone()
            if row is not None:  # present, or being written or deleted
                return BlockState.PRESENT if row[0] == BlockState.PRESENT else BlockState.WRITING
            victims = make_room(db, size, cap, protected)
            if victims is None:
                return Refusal.NO_ROOM
            doomed = condemn(db, victims, writer)
            insert_block(db, ref, size, BlockState.WRITING, stamp, writer)
            add_used(db, size)
        self._delete_files(doomed, writer, unlink)
        return [(v.ref, v.size) for v in victims if v.state is BlockState.PRESENT]

    def commit(self, ref: BlockRef, size: int, stamp: int, writer: str) -> None:
        """Our write is complete under its final name: present for all."""
        with self.transaction() as db:
            done = db.execute(
                "UPDATE blocks SET state=? WHERE ns=? AND key=? AND writer=? AND state=?",
                (BlockState.PRESENT, ref.namespace, ref.key, writer, BlockState.WRITING),
            ).rowcount
            if not done:
                taken = db.execute(
                    "SELECT 1 FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key)
                ).fetchone()
                if taken:
                    return  # stored, or being stored, by another: the same bytes
                # Our reservation was reclaimed as stale (over an hour old):
                # the file is complete and ours, so it is present again.
                insert_block(db, ref, size, BlockState.PRESENT, stamp, writer)
                add_used(db, size)
            log_change(db, ref, size, added=True, writer=writer)

    def abort(self, ref: BlockRef, writer: str) -> None:
        """Our store wrote nothing: release its bytes. If the ledger cannot
        be written now (a full disk fails its journal too), the release is
        kept and tried again by ``retry_deferred``, so no room leaks."""
        try:
            with self.transaction() as db:
                size = db.execute(
                    "SELECT size FROM blocks WHERE ns=? AND key=? AND writer=? AND state=?",
                    (ref.namespace, ref.key, writer, BlockState.WRITING),
                ).fetchone()
                if size is not None:
                    db.execute("DELETE FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key))
                    add_used(db, -size[0])
        except sqlite3.Error:
            self._defer(lambda: self.abort(ref, writer))

    def retry_deferred(self) -> None:
        """The releases a failed transaction left (abort, _delete_files),
        tried again; each one that fails again is kept again."""
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, []
        for release in deferred:
            release()

    def _defer(self, release) -> None:
        with self._deferred_lock:
            self._deferred.append(release)

    def forget(
        self,
        refs: Iterable[BlockRef],
        writer: str,
        unlink: Unlink | None,
        still_bad: Protected | None = None,
    ) -> list[BlockRef]:
        """Remove present blocks (bad, or deleted by an administrator), with
        their files if ``unlink``; returns those the ledger held. With
        ``still_bad``, only the blocks it says still hold what was found bad:
        asked inside the transaction, where a present row's file cannot
        change (a store renames its file in before it commits, an eviction
        condemns the row first)."""
        with self.transaction() as db:
            gone = []
            for ref in refs:
                size = db.execute(
                    "SELECT size FROM blocks WHERE ns=? AND key=? AND state=?",
                    (ref.namespace, ref.key, BlockState.PRESENT),
                ).fetchone()
                if size is not None and (still_bad is None or still_bad(ref)):
                    gone.append(Victim(ref, size[0], BlockState.PRESENT))
            doomed = condemn(db, gone, writer)
        self._delete_files(doomed, writer, unlink)
        return [v.ref for v in gone]

    # -- room ---------------------------------------------------------------------

    def evict_to_cap(
        self, cap: int | None, writer: str, protected: Protected, unlink: Unlink
    ) -> list[tuple[BlockRef, int]]:
        """Evict least recent blocks until within ``cap`` (a lowered cap)."""
        with self.transaction() as db:
            victims = make_room(db, 0, cap, protected, partial=True) or []
            doomed = condemn(db, victims, writer)
        self._delete_files(doomed, writer, unlink)
        return [(v.ref, v.size) for v in victims if v.state is BlockState.PRESENT]

    def _delete_files(self, doomed: list[Victim], writer: str, unlink: Unlink | None) -> None:
        """Outside the transaction (an unlink of a large file takes a
        fraction of a millisecond, too long to hold every server's lock):
        unlink, then release the rows and their bytes. A name stays taken
        until its file is gone, so no store lands under it meanwhile."""
        if not doomed:
            return
        if unlink is not None:
            for victim in doomed:
                unlink(victim.ref)
        self._release_rows(doomed, writer)

    def _release_rows(self, doomed: list[Victim], writer: str) -> None:
        """The condemned rows whose files are gone, and their bytes. If that
        transaction fails (busy past its timeout, a full disk), the release
        is deferred, not raised: the files are gone already, so the caller
        must still learn its victims (and a store keep its reservation);
        until the retry the rows keep their names taken and their bytes
        counted, which errs on the safe side."""
        try:
            with self.transaction() as db:
                for victim in doomed:
                    ref = victim.ref
                    gone = db.execute(
                        "DELETE FROM blocks WHERE ns=? AND key=? AND state=? AND writer=?",
                        (ref.namespace, ref.key, BlockState.DELETING, writer),
                    ).rowcount
                    if gone:
                        add_used(db, -victim.size)
                        add_used(db, -victim.size, "deleting")
        except sqlite3.Error:
            self._defer(lambda: self._release_rows(doomed, writer))

    # -- feed (the feed thread) ------------------------------------------------

    def touch(self, stamps: dict[BlockRef, int]) -> None:
        """Blocks restored or hit: later victims. Never moves a stamp back."""
        with self.transaction() as db:
            db.executemany(
                "UPDATE blocks SET last_use=max(last_use, ?) WHERE ns=? AND key=?",
                [(stamp, ref.namespace, ref.key) for ref, stamp in stamps.items()],
            )

    def changes_since(self, seq: int, limit: int = 10_000) -> tuple[list[Change], bool]:
        """Changes after ``seq``, and whether some were pruned before they
        were read (the reader must then reload a snapshot)."""
        db = self._conn()
        first = db.execute("SELECT min(seq), max(seq) FROM changes").fetchone()
        gap = first[0] is not None and (first[0] > seq + 1 or first[1] < seq)
        rows = db.execute(
            "SELECT seq, ns, key, size, added, writer FROM changes WHERE seq>? ORDER BY seq "
            "LIMIT ?",
            (seq, limit),
        ).fetchall()
        return [Change(s, BlockRef(ns, k), n, bool(a), w) for s, ns, k, n, a, w in rows], gap

    def snapshot(self, namespace: bytes) -> tuple[list[tuple[bytes, int]], int]:
        """The namespace's present blocks, least recent first, and the last
        change they include (read in one transaction: consistent)."""
        db = self._conn()
        db.execute("BEGIN")
        try:
            rows = db.execute(
                "SELECT key, size FROM blocks WHERE ns=? AND state=? ORDER BY last_use",
                (namespace, BlockState.PRESENT),
            ).fetchall()
            seq = db.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]
        finally:
            db.execute("COMMIT")
        return [(key, size) for key, size in rows], seq

    def used_bytes(self) -> int:
        return used(self._conn())

    def prune_changes(self, older_than_s: float) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM changes WHERE at<?", (time.time() - older_than_s,))
