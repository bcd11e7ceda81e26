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
transaction each; the files a reservation evicts are unlinked after it, and
their rows released in a second one); the feed thread writes batched touches and reads changes;
start-up reconciles the ledger with the files (ledger_startup.py); the
``kv-store`` admin command forgets what it deletes.

Why SQLite in WAL mode: it ships with Python, readers never wait for the
writer, writers queue on one lock (with a timeout), and a process killed in
a transaction leaves nothing half-done. WAL shares memory between the
processes, so the store must be on a local filesystem (the docs say why).

Invariants, at every commit:
- ``meta.used`` is the sum of ``blocks.size``, rows being written and
  deleted included; ``meta.deleting`` the sum over rows being deleted;
- after a reservation ``used`` <= the reserving server's cap (servers on one
  store should give the same cap; if not, each store obeys its own);
- a row being written (WRITING) is never a victim; one whose writer's
  process is gone, or that is over an hour old, is reclaimed when room is
  short (its temp file is the start-up scan's to remove);
- a victim stays in the ledger, counted and its name taken, as "being
  deleted" (DELETING) until its file is unlinked: the unlink happens outside
  the write lock, and no store can land under the name before it.
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

from vllm_uma.kv_offload.disk.block_state import BlockState
from vllm_uma.kv_offload.disk.index import Refusal
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
    state INTEGER NOT NULL,          -- a BlockState's int value (block_state.py)
    last_use INTEGER NOT NULL,       -- ns since the epoch: the LRU order
    writer TEXT NOT NULL, writer_pid INTEGER NOT NULL, since REAL NOT NULL,
    PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_lru ON blocks (last_use, ns, key);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ns BLOB NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL,
    added INTEGER NOT NULL, writer TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('used', 0);
INSERT OR IGNORE INTO meta VALUES ('deleting', 0);
"""


class LedgerError(RuntimeError):
    """The ledger cannot be used; the message names the file and the fix."""


class _Victim(NamedTuple):
    ref: BlockRef
    size: int
    state: BlockState  # PRESENT, or an abandoned WRITING / DELETING row


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
                db.execute("COMMIT")
            except BaseException:
                # Also when COMMIT itself failed (busy, a full disk): the
                # connection must not stay inside the transaction.
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise

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
            victims = self._make_room(db, size, cap, protected)
            if victims is None:
                return Refusal.NO_ROOM
            doomed = self._condemn(db, victims, writer)
            db.execute(
                "INSERT INTO blocks VALUES (?,?,?,?,?,?,?,?)",
                (
                    ref.namespace,
                    ref.key,
                    size,
                    BlockState.WRITING,
                    stamp,
                    writer,
                    os.getpid(),
                    time.time(),
                ),
            )
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
                db.execute(
                    "INSERT INTO blocks VALUES (?,?,?,?,?,?,?,?)",
                    (
                        ref.namespace,
                        ref.key,
                        size,
                        BlockState.PRESENT,
                        stamp,
                        writer,
                        os.getpid(),
                        time.time(),
                    ),
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
                    "SELECT size FROM blocks WHERE ns=? AND key=? AND writer=? AND state=?",
                    (ref.namespace, ref.key, writer, BlockState.WRITING),
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
        with self.transaction() as db:
            gone = []
            for ref in refs:
                size = db.execute(
                    "SELECT size FROM blocks WHERE ns=? AND key=? AND state=?",
                    (ref.namespace, ref.key, BlockState.PRESENT),
                ).fetchone()
                if size is not None:
                    gone.append(_Victim(ref, size[0], BlockState.PRESENT))
            doomed = self._condemn(db, gone, writer)
        self._delete_files(doomed, writer, unlink)
        return [v.ref for v in gone]

    # -- room ---------------------------------------------------------------------

    def evict_to_cap(
        self, cap: int | None, writer: str, protected: Protected, unlink: Unlink
    ) -> list[tuple[BlockRef, int]]:
        """Evict least recent blocks until within ``cap`` (a lowered cap)."""
        with self.transaction() as db:
            victims = self._make_room(db, 0, cap, protected, partial=True) or []
            doomed = self._condemn(db, victims, writer)
        self._delete_files(doomed, writer, unlink)
        return [(v.ref, v.size) for v in victims if v.state is BlockState.PRESENT]

    def _make_room(
        self,
        db: sqlite3.Connection,
        size: int,
        cap: int | None,
        protected: Protected,
        partial: bool = False,
    ) -> list[_Victim] | None:
        if cap is None:
            return []
        # Bytes already being deleted are freed by whoever deletes them: not
        # counting them here keeps concurrent stores from evicting the same
        # room twice (and from running out of victims).
        excess = _used(db) - _meta(db, "deleting") + size - cap
        chosen: list[_Victim] = []
        if excess <= 0:
            return chosen
        freed = 0
        for victim in self._candidates(db):
            if victim.state is BlockState.PRESENT and protected(victim.ref):
                continue
            chosen.append(victim)
            freed += victim.size
            if freed >= excess:
                return chosen
        return chosen if partial else None

    def _candidates(self, db: sqlite3.Connection) -> Iterator[_Victim]:
        """Present blocks least recent first, then rows a dead process left
        being written or deleted."""
        after = (-1, b"", b"")
        while True:
            page = db.execute(
                "SELECT ns, key, size, last_use FROM blocks WHERE state=? "
                "AND (last_use, ns, key) > (?, ?, ?) ORDER BY last_use, ns, key LIMIT ?",
                (BlockState.PRESENT, *after, _PAGE),
            ).fetchall()
            for ns, key, size, _ in page:
                yield _Victim(BlockRef(ns, key), size, BlockState.PRESENT)
            if len(page) < _PAGE:
                break
            after = (page[-1][3], page[-1][0], page[-1][1])
        now = time.time()
        for ns, key, size, state, pid, since in db.execute(
            "SELECT ns, key, size, state, writer_pid, since FROM blocks WHERE state!=?",
            (BlockState.PRESENT,),
        ).fetchall():
            if now - since > STALE_WRITE_S or not pid_is_alive(pid):
                yield _Victim(BlockRef(ns, key), size, BlockState(state))

    def _condemn(
        self, db: sqlite3.Connection, victims: list[_Victim], writer: str
    ) -> list[_Victim]:
        """Inside the transaction: present victims become DELETING (still
        counted, their names taken, announced as removed), abandoned
        deletions become ours; returns what ``_delete_files`` must finish.
        An abandoned write had no file yet: its row just goes."""
        doomed = []
        for victim in victims:
            ref = victim.ref
            if victim.state is BlockState.WRITING:
                db.execute("DELETE FROM blocks WHERE ns=? AND key=?", (ref.namespace, ref.key))
                add_used(db, -victim.size)
                continue
            db.execute(
                "UPDATE blocks SET state=?, writer=?, writer_pid=?, since=? WHERE ns=? AND key=?",
                (BlockState.DELETING, writer, os.getpid(), time.time(), ref.namespace, ref.key),
            )
            if victim.state is BlockState.PRESENT:
                log_change(db, ref, victim.size, added=False, writer=writer)
                add_used(db, victim.size, "deleting")
            doomed.append(victim)
        return doomed

    def _delete_files(self, doomed: list[_Victim], writer: str, unlink: Unlink | None) -> None:
        """Outside the transaction (an unlink of a large file takes a
        fraction of a millisecond, too long to hold every server's lock):
        unlink, then release the rows and their bytes. A name stays taken
        until its file is gone, so no store lands under it meanwhile."""
        if not doomed:
            return
        if unlink is not None:
            for victim in doomed:
                unlink(victim.ref)
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
        return _used(self._conn())

    def prune_changes(self, older_than_s: float) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM changes WHERE at<?", (time.time() - older_than_s,))


def _used(db: sqlite3.Connection) -> int:
    return _meta(db, "used")


def _meta(db: sqlite3.Connection, name: str) -> int:
    return db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()[0]


def add_used(db: sqlite3.Connection, delta: int, name: str = "used") -> None:
    db.execute("UPDATE meta SET value=value+? WHERE name=?", (delta, name))


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
