"""L3 shared bookkeeping: one SQLite ledger per store, for every server on it.

Several servers (engine-core processes, same or different models) may share
one root_dir. The block files hold the KV; the ledger,
``root_dir/.noindex/ledger.sqlite3``, is what the servers agree on:

- which block files exist or are being written, their sizes and their LRU
  order (``last_use``), so that one cap holds for the directory whoever
  stores, and a victim is the least recent block of any server;
- a change feed (table ``changes``): a block stored by one server is found
  by the others, a block evicted by one leaves their indexes (ledger_feed.py).

Who calls it, all in engine-core processes and never on the scheduler
thread: the I/O threads reserve, commit, abort and forget blocks (one short
transaction each, and the files a transaction evicts are unlinked before it
commits, so no server can store the same name between the row's removal and
the file's); the feed thread writes batched touches and reads changes;
start-up reconciles the ledger with the files (ledger_startup.py); the
``kv-store`` admin command forgets what it deletes.

Why SQLite in WAL mode: it ships with Python, readers never wait for the
writer, writers queue on one lock (with a timeout), and a process killed in
a transaction leaves nothing half-done. WAL shares memory between the
processes, so the store must be on a local filesystem (the docs say why).

Invariants, at every commit:
- ``meta.used`` is the sum of ``blocks.size``, rows being written included;
- after a reservation ``used`` <= the reserving server's cap (servers on one
  store should give the same cap; if not, each store obeys its own);
- a row being written (state 0) is never a victim; one whose writer's
  process is gone, or that is over an hour old, is reclaimed when room is
  short (its temp file is the start-up scan's to remove).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from vllm_uma.kv_offload.disk.index import BlockState, Refusal
from vllm_uma.kv_offload.disk.layout import BlockRef, pid_is_alive

LEDGER_FILE = "ledger.sqlite3"
# A writer waits this long for another's transaction before giving up (the
# store then fails and the block stays in RAM): transactions last
# microseconds, start-up reconciliation of a large store up to seconds.
BUSY_TIMEOUT_S = 10.0
STALE_WRITE_S = 3600
_PAGE = 256  # victim candidates read per query

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    ns BLOB NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL,
    state INTEGER NOT NULL,          -- 0 being written, 1 present
    last_use INTEGER NOT NULL,       -- ns since the epoch: the LRU order
    writer TEXT NOT NULL, writer_pid INTEGER NOT NULL, since REAL NOT NULL,
    PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_lru ON blocks (last_use);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ns BLOB NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL,
    added INTEGER NOT NULL, writer TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('used', 0);
"""


class LedgerError(RuntimeError):
    """The ledger cannot be used; the message names the file and the fix."""


class Change(NamedTuple):
    seq: int
    ref: BlockRef
    size: int
    added: bool
    writer: str


Unlink = Callable[[BlockRef], None]
Protected = Callable[[BlockRef], bool]


class Ledger:
    """One handle per process and store; each thread gets its own connection."""

    def __init__(self, noindex: Path):
        self.path = noindex / LEDGER_FILE
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Writers of this process queue here, woken at once when the lock is
        # free; SQLite's own busy handler (sleeps of 1 ms to 100 ms between
        # tries) is left to waits on other processes.
        self._write_lock = threading.Lock()
        self._deferred: list[tuple[BlockRef, str]] = []  # aborts to retry

    def create(self) -> None:
        """Create the file (0600: SQLite gives its -wal and -shm files the
        same mode) and the schema; refuse anything but our regular file."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
            os.close(fd)
        except FileExistsError:
            pass
        for suffix in ("", "-wal", "-shm"):
            _check_own_file(Path(str(self.path) + suffix))
        # One script, one transaction: two servers starting at once agree.
        self._conn().executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            # A power loss may lose the last commits, never corrupt the file:
            # at worst a block is indexed that is gone (a clean miss).
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE (the write lock, so what is read stays true until
        COMMIT) ... COMMIT, or ROLLBACK on any exception."""
        db = self._conn()
        with self._write_lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

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
        within ``cap``. Returns the victims (rows gone, files unlinked), a
        Refusal with nothing changed, or the state of the row another store
        already holds under that name (nothing to write)."""
        if cap is not None and size > cap:
            return Refusal.TOO_BIG
        with self.transaction() as db:
            row = db.execute(
                "SELECT state FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key)
            ).fetchone()
            if row is not None:
                return BlockState.PRESENT if row[0] else BlockState.WRITING
            victims = self._make_room(db, size, cap, protected)
            if victims is None:
                return Refusal.NO_ROOM
            self._remove_rows(db, victims, writer, unlink)
            db.execute(
                "INSERT INTO blocks VALUES (?,?,?,0,?,?,?,?)",
                (ref.namespace, ref.key, size, stamp, writer, os.getpid(), time.time()),
            )
            add_used(db, size)
        return _present(victims)

    def commit(self, ref: BlockRef, size: int, stamp: int, writer: str) -> None:
        """Our write is complete under its final name: present for all."""
        with self.transaction() as db:
            done = db.execute(
                "UPDATE blocks SET state=1 WHERE ns=? AND key=? AND writer=? AND state=0",
                (ref.namespace, ref.key, writer),
            ).rowcount
            if not done:
                taken = db.execute(
                    "SELECT 1 FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key)
                ).fetchone()
                if taken:
                    return  # stored, or being stored, by another: the same bytes
                # Our reservation was reclaimed as stale (over an hour old):
                # the file is complete and ours, so it is present again.
                db.execute(
                    "INSERT INTO blocks VALUES (?,?,?,1,?,?,?,?)",
                    (ref.namespace, ref.key, size, stamp, writer, os.getpid(), time.time()),
                )
                add_used(db, size)
            log_change(db, ref, size, added=True, writer=writer)

    def abort(self, ref: BlockRef, writer: str) -> None:
        """Our store wrote nothing: release its bytes. If the ledger cannot
        be written now (a full disk fails its journal too), the release is
        kept and tried again by ``retry_deferred``, so no room leaks."""
        try:
            with self.transaction() as db:
                size = db.execute(
                    "SELECT size FROM blocks WHERE ns=? AND key=? AND writer=? AND state=0",
                    (ref.namespace, ref.key, writer),
                ).fetchone()
                if size is not None:
                    db.execute("DELETE FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key))
                    add_used(db, -size[0])
        except sqlite3.Error:
            with self._lock:
                self._deferred.append((ref, writer))

    def retry_deferred(self) -> None:
        with self._lock:
            deferred, self._deferred = self._deferred, []
        for ref, writer in deferred:
            self.abort(ref, writer)

    def forget(
        self, refs: Iterable[BlockRef], writer: str, unlink: Unlink | None
    ) -> list[BlockRef]:
        """Remove present blocks (bad, or deleted by an administrator), with
        their files if ``unlink``; returns those the ledger held."""
        gone = []
        with self.transaction() as db:
            for ref in refs:
                size = db.execute(
                    "SELECT size FROM blocks WHERE ns=? AND key=? AND state=1",
                    (ref.namespace, ref.key),
                ).fetchone()
                if size is not None:
                    gone.append((ref, size[0], BlockState.PRESENT))
            self._remove_rows(db, gone, writer, unlink)
        return [ref for ref, _, _ in gone]

    # -- room ---------------------------------------------------------------------

    def evict_to_cap(
        self, cap: int | None, writer: str, protected: Protected, unlink: Unlink
    ) -> list[tuple[BlockRef, int]]:
        """Evict least recent blocks until within ``cap`` (a lowered cap)."""
        with self.transaction() as db:
            victims = self._make_room(db, 0, cap, protected, partial=True)
            self._remove_rows(db, victims or [], writer, unlink)
        return _present(victims or [])

    def _make_room(
        self,
        db: sqlite3.Connection,
        size: int,
        cap: int | None,
        protected: Protected,
        partial: bool = False,
    ) -> list[tuple[BlockRef, int, BlockState]] | None:
        if cap is None:
            return []
        excess = _used(db) + size - cap
        chosen: list[tuple[BlockRef, int, BlockState]] = []
        if excess <= 0:
            return chosen
        freed = 0
        for ref, nbytes, state in self._candidates(db):
            if state is BlockState.PRESENT and protected(ref):
                continue
            chosen.append((ref, nbytes, state))
            freed += nbytes
            if freed >= excess:
                return chosen
        return chosen if partial else None

    def _candidates(self, db: sqlite3.Connection) -> Iterator[tuple[BlockRef, int, BlockState]]:
        """Present blocks least recent first, then abandoned writes."""
        last = -1
        while True:
            page = db.execute(
                "SELECT ns, key, size, last_use FROM blocks WHERE state=1 AND last_use>=? "
                "ORDER BY last_use LIMIT ?",
                (last, _PAGE),
            ).fetchall()
            for ns, key, size, _ in page:
                yield BlockRef(ns, key), size, BlockState.PRESENT
            if len(page) < _PAGE:
                break
            # Rows sharing the boundary stamp are read twice: skip them once.
            last = page[-1][3] + 1
        now = time.time()
        for ns, key, size, pid, since in db.execute(
            "SELECT ns, key, size, writer_pid, since FROM blocks WHERE state=0"
        ).fetchall():
            if now - since > STALE_WRITE_S or not pid_is_alive(pid):
                yield BlockRef(ns, key), size, BlockState.WRITING

    def _remove_rows(
        self,
        db: sqlite3.Connection,
        rows: list[tuple[BlockRef, int, BlockState]],
        writer: str,
        unlink: Unlink | None,
    ) -> None:
        for ref, size, state in rows:
            db.execute("DELETE FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key))
            add_used(db, -size)
            if state is BlockState.PRESENT:
                log_change(db, ref, size, added=False, writer=writer)
                if unlink is not None:
                    unlink(ref)

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
                "SELECT key, size FROM blocks WHERE ns=? AND state=1 ORDER BY last_use",
                (namespace,),
            ).fetchall()
            seq = db.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]
        finally:
            db.execute("COMMIT")
        return [(key, size) for key, size in rows], seq

    def used_bytes(self) -> int:
        return _used(self._conn())

    def prune_changes(self, older_than_s: float) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM changes WHERE at<?", (time.time() - older_than_s,))


def _present(rows: list[tuple[BlockRef, int, BlockState]]) -> list[tuple[BlockRef, int]]:
    """Victims that were blocks (abandoned writes had no file to announce)."""
    return [(ref, size) for ref, size, state in rows if state is BlockState.PRESENT]


def _used(db: sqlite3.Connection) -> int:
    return db.execute("SELECT value FROM meta WHERE name='used'").fetchone()[0]


def add_used(db: sqlite3.Connection, delta: int) -> None:
    db.execute("UPDATE meta SET value=value+? WHERE name='used'", (delta,))


def log_change(db: sqlite3.Connection, ref: BlockRef, size: int, *, added: bool, writer: str):
    db.execute(
        "INSERT INTO changes (ns, key, size, added, writer, at) VALUES (?,?,?,?,?,?)",
        (ref.namespace, ref.key, size, int(added), writer, time.time()),
    )


def _check_own_file(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise LedgerError(
            f"{path} is not a regular file owned by this user (uid {os.geteuid()}): the "
            f"disk KV tier keeps its shared bookkeeping there and will not use anything "
            f"else. Remove it (the tier rebuilds it from the block files)."
        )
