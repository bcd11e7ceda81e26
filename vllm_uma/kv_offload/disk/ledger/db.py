"""L3 ledger plumbing: the SQLite file, its schema, a connection per thread.

Engine-core processes (I/O threads, the feed thread, start-up) and the
``kv-store`` admin command; never the scheduler thread. What the rows mean
and the invariants every commit keeps: the package docstring (__init__.py).
Nothing here knows what a store or an eviction is: blocks.py and room.py
hold the queries.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef

LEDGER_FILE = "ledger.sqlite3"
# A writer waits this long for another's transaction before giving up (the
# store then fails and the block stays in RAM): transactions last
# microseconds, start-up reconciliation of a large store up to seconds.
BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    ns BLOB NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL,
    state INTEGER NOT NULL,          -- a BlockState's int value (index.py)
    last_use INTEGER NOT NULL,       -- ns since the epoch: the LRU order
    writer TEXT NOT NULL, writer_pid INTEGER NOT NULL, since REAL NOT NULL,
    PRIMARY KEY (ns, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_lru ON blocks (last_use, ns, key);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ns BLOB NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL,
    added INTEGER NOT NULL, writer TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS pins (
    ns BLOB NOT NULL, name TEXT NOT NULL,
    expires REAL,                    -- seconds since the epoch; NULL: until unpinned
    created REAL NOT NULL, tokens INTEGER NOT NULL,
    block_bytes INTEGER NOT NULL,    -- one block file of the namespace
    PRIMARY KEY (ns, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pin_blocks (
    ns BLOB NOT NULL, name TEXT NOT NULL, pos INTEGER NOT NULL, key BLOB NOT NULL,
    PRIMARY KEY (ns, name, pos)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pin_blocks_key ON pin_blocks (ns, key);
INSERT OR IGNORE INTO meta VALUES ('used', 0);
INSERT OR IGNORE INTO meta VALUES ('deleting', 0);
"""


class LedgerError(RuntimeError):
    """The ledger cannot be used; the message names the file and the fix."""


class LedgerDB:
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

    def read(self) -> sqlite3.Connection:
        """This thread's connection, for reads outside a transaction (each
        statement sees one committed state; WAL readers never wait)."""
        return self._conn()

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


def is_disk_full(exc: BaseException) -> bool:
    """SQLite's own "database or disk is full": the volume's ENOSPC."""
    return getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL"


def used(db: sqlite3.Connection) -> int:
    return meta_value(db, "used")


def meta_value(db: sqlite3.Connection, name: str) -> int:
    return db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()[0]


def add_used(db: sqlite3.Connection, delta: int, name: str = "used") -> None:
    db.execute("UPDATE meta SET value=value+? WHERE name=?", (delta, name))


def insert_block(
    db: sqlite3.Connection,
    ref: BlockRef,
    size: int,
    state: BlockState,
    last_use: int,
    writer: str,
    writer_pid: int | None = None,
    since: float | None = None,
) -> None:
    """A new row of ``blocks``; by default this process's, from now."""
    db.execute(
        "INSERT INTO blocks VALUES (?,?,?,?,?,?,?,?)",
        (
            ref.namespace,
            ref.key,
            size,
            state,
            last_use,
            writer,
            os.getpid() if writer_pid is None else writer_pid,
            time.time() if since is None else since,
        ),
    )


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
