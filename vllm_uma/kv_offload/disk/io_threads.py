"""L3 I/O threads: the only place the disk tier touches the disk while serving.

The disk tier (scheduler thread, engine-core process) submits one task per
block file; a few threads run them and put an ``Outcome`` on a queue that
the scheduler thread drains. Tasks never raise and never touch the index:
they do the I/O and say what happened, and the scheduler thread applies it.
What crosses the boundary: paths, keys, memoryview slices of the primary
rows (which vLLM keeps pinned until the job's result is returned), outcomes.

Loads run before deletes, deletes before stores: a restore is on some
request's time-to-first-token, a delete frees the room a store waits for,
and a store is a background copy of bytes that are still in L2.

Threads: several reads in flight keep the disk's queue full while other
threads checksum (zlib.crc32 and the syscalls release the GIL). Measured
here (2 cores shared with other work, virtio disk, 360 KiB blocks, page
cache dropped, checksums on): 1 thread restored 0.6-0.7 GB/s, 2 threads
0.9-1.0, 4 threads 1.0-1.4, 8 threads 1.0-1.6, 16 threads 0.9-1.5. Past 4 the
restore is bound by CPU (about 220 us per block: 90 crc32, 70 kernel, the
rest Python), not by the disk; 8 keep a faster disk (NVMe) busy too.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from pathlib import Path

from vllm_uma.kv_offload.disk.block_file import PROCESS_ERRNOS, BadBlock, BadReason, file_bytes
from vllm_uma.kv_offload.disk.block_read import read_block
from vllm_uma.kv_offload.disk.block_state import BlockState
from vllm_uma.kv_offload.disk.block_write import write_block
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.room import Refusal

DEFAULT_IO_THREADS = 8
# The longest a stop waits for the I/O threads to finish the file they are on.
SHUTDOWN_TIMEOUT_S = 5.0


class Priority(IntEnum):
    STOP = 0
    LOAD = 1
    DELETE = 2
    STORE = 3


class StoreFailure(Enum):
    """Why a store wrote nothing (also the metric label)."""

    DISK_FULL = "disk_full"  # ENOSPC / EDQUOT: no later store can succeed either
    IO_ERROR = "io_error"  # any other OSError; other stores may still succeed
    LEDGER = "ledger"  # the shared ledger could not be read or written in time


class Ticket:
    """A queued load's claim: either an I/O thread starts it, or the
    scheduler thread gives up on it first (a miss), never both. A load an
    I/O thread has started cannot be given up: the kernel may still be
    writing into its row, which vLLM would hand to another block."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "queued"

    def _claim(self, state: str) -> bool:
        with self._lock:
            if self._state != "queued":
                return False
            self._state = state
            return True

    def start(self) -> bool:
        return self._claim("started")

    def cancel(self) -> bool:
        return self._claim("cancelled")


@dataclass(frozen=True, slots=True)
class Shared:
    """What every task of one tier needs to keep the shared ledger."""

    layout: Layout  # files are reached through it, never following a symlink
    ledger: Ledger
    writer: str  # this tier's name in the ledger
    cap_bytes: int | None
    protected: Callable[[BlockRef], bool]  # never evicted now (pinned, just hit)


@dataclass(frozen=True, slots=True)
class BlockIO:
    """One block's I/O, as submitted. ``job_id`` is None for a housekeeping
    delete (no vLLM job waits for it)."""

    job_id: int | None
    ref: BlockRef
    shared: Shared
    row: memoryview | None = None  # the primary-tier row to read or fill
    direct: bool = False
    stamp: int = 0  # a store's place in the LRU order (ns)
    ticket: Ticket | None = None  # a load the scheduler may give up on while queued

    @property
    def path(self) -> Path:  # for messages
        return self.shared.layout.path(self.ref)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one task did."""

    job_id: int | None
    ref: BlockRef
    ok: bool
    failure: BadReason | StoreFailure | Refusal | None = None
    detail: str = ""  # for the warning: errno name, strerror, path
    nbytes: int = 0  # payload bytes moved
    start: float = 0.0  # perf_counter at the start and end of the I/O
    end: float = 0.0
    victims: tuple[BlockRef, ...] = ()  # evicted (rows and files gone) to make room
    taken: BlockState | None = None  # a store found the name held already
    freed: bool = False  # a delete removed a file
    unlink_errors: tuple[str, ...] = ()  # victims whose file could not be removed


def store_task(io: BlockIO) -> Outcome:
    """Reserve room in the ledger (evicting), write the file, commit."""
    assert io.row is not None
    shared, start = io.shared, time.perf_counter()
    errors: list[str] = []
    size = file_bytes(io.row.nbytes)
    try:
        reserved = shared.ledger.reserve(
            io.ref,
            size,
            io.stamp,
            shared.cap_bytes,
            shared.writer,
            shared.protected,
            unlinker(shared.layout, errors),
        )
    except sqlite3.Error as exc:
        return _failed(io, _ledger_failure(exc), f"ledger {shared.ledger.path}: {exc}")
    if isinstance(reserved, Refusal):
        return _failed(io, reserved, reserved.value)
    if isinstance(reserved, BlockState):  # another store holds the name
        return Outcome(io.job_id, io.ref, True, taken=reserved)
    done = dict(victims=tuple(ref for ref, _ in reserved), unlink_errors=tuple(errors))
    try:
        with shared.layout.block_dir(io.ref, create=True) as dir_fd:
            write_block(
                io.path, io.ref.key, io.ref.namespace, io.row, direct=io.direct, dir_fd=dir_fd
            )
    except OSError as exc:
        shared.ledger.abort(io.ref, shared.writer)
        # Only the kernel's own word for "no room" is a full disk.
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        failure = StoreFailure.DISK_FULL if full else StoreFailure.IO_ERROR
        code = errno.errorcode.get(exc.errno or 0, "OSError")
        detail = f"{code}: {exc.strerror or exc} ({io.path})"
        return Outcome(io.job_id, io.ref, False, failure, detail, **done)
    try:
        shared.ledger.commit(io.ref, size, io.stamp, shared.writer)
    except sqlite3.Error as exc:
        # Not in the ledger, so not counted: the file must go too.
        with contextlib.suppress(OSError):
            shared.layout.unlink(io.ref)
        shared.ledger.abort(io.ref, shared.writer)
        detail = f"ledger {shared.ledger.path}: {exc}"
        return Outcome(io.job_id, io.ref, False, _ledger_failure(exc), detail, **done)
    end = time.perf_counter()
    return Outcome(io.job_id, io.ref, True, nbytes=io.row.nbytes, start=start, end=end, **done)


def unlinker(layout: Layout, errors: list[str]) -> Callable[[BlockRef], None]:
    """Unlink a victim; a failure is reported, not raised (the room is
    counted free: the file stays untracked until the next start-up)."""

    def unlink(ref: BlockRef) -> None:
        try:
            layout.unlink(ref)
        except OSError as exc:
            errors.append(f"unlink {layout.path(ref)}: {exc.strerror or exc}")

    return unlink


def _ledger_failure(exc: sqlite3.Error) -> StoreFailure:
    # SQLite's own "database or disk is full" is the volume's ENOSPC.
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL":
        return StoreFailure.DISK_FULL
    return StoreFailure.LEDGER


def load_task(io: BlockIO) -> Outcome | None:
    """None if the load was given up while it waited (no outcome: the
    scheduler thread already counted it as a miss)."""
    assert io.row is not None
    if io.ticket is not None and not io.ticket.start():
        return None
    start = time.perf_counter()
    try:
        with io.shared.layout.block_dir(io.ref, create=False) as dir_fd:
            read_block(
                io.path, io.ref.key, io.ref.namespace, io.row, direct=io.direct, dir_fd=dir_fd
            )
            end = time.perf_counter()
            # Restored = recently used: the new mtime keeps the LRU order
            # across a restart. The file may be gone already (evicted after
            # this read); fine.
            with contextlib.suppress(OSError):
                os.utime(io.path.name, dir_fd=dir_fd, follow_symlinks=False)
    except BadBlock as bad:
        return _failed(io, bad.reason, str(bad))
    except FileNotFoundError:
        return _failed(io, BadReason.MISSING, f"{io.path}: its directory is gone")
    except OSError as exc:
        if exc.errno in PROCESS_ERRNOS:
            # Out of descriptors or memory: a miss this time, the file is fine.
            return _failed(io, StoreFailure.IO_ERROR, f"{io.path}: {exc}")
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            detail = f"{io.path}: a directory on its way is a symlink or not a directory"
            return _failed(io, BadReason.NOT_A_FILE, detail)
        # fstat or fadvise failed: the file cannot be trusted either.
        return _failed(io, BadReason.UNREADABLE, f"{io.path}: {exc}")
    return Outcome(io.job_id, io.ref, True, nbytes=io.row.nbytes, start=start, end=end)


def delete_task(io: BlockIO) -> Outcome:
    """Forget a bad block in the ledger and delete its file, in one
    transaction (no store of the same name can land in between)."""
    shared, errors = io.shared, []
    try:
        gone = shared.ledger.forget([io.ref], shared.writer, unlinker(shared.layout, errors))
    except sqlite3.Error as exc:
        return _failed(io, StoreFailure.LEDGER, f"ledger {shared.ledger.path}: {exc}")
    if errors:
        return _failed(io, StoreFailure.IO_ERROR, errors[0])
    return Outcome(io.job_id, io.ref, True, freed=bool(gone))


def _failed(io: BlockIO, failure: BadReason | StoreFailure, detail: str) -> Outcome:
    return Outcome(io.job_id, io.ref, False, failure, detail)


class IOPool:
    """A few daemon threads running tasks by Priority, FIFO within one."""

    def __init__(self, num_threads: int, outcomes: queue.SimpleQueue, name: str):
        if num_threads < 1:
            raise ValueError(f"io_threads={num_threads} is invalid: it must be >= 1")
        self._tasks: queue.PriorityQueue = queue.PriorityQueue()
        self._outcomes = outcomes
        self._seq = itertools.count()  # FIFO among equal priorities
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, priority: Priority, task: Callable[[BlockIO], Outcome | None], io: BlockIO
    ) -> None:
        self._tasks.put((priority, next(self._seq), task, io))

    def _run(self) -> None:
        while True:
            priority, _, task, io = self._tasks.get()
            try:
                if priority is Priority.STOP:
                    return
                try:
                    outcome = task(io)
                except Exception as exc:  # a bug must still end its job
                    outcome = _failed(io, StoreFailure.IO_ERROR, repr(exc))
                if outcome is not None:
                    self._outcomes.put(outcome)
            finally:
                self._tasks.task_done()

    def wait_idle(self) -> None:
        """Block until every submitted task has run and put its outcome."""
        self._tasks.join()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> "PoolStopped":
        """Stop the threads after the tasks they are running; queued tasks
        are dropped (a dropped store leaves no file, a temp file at most).
        Waits at most ``timeout_s`` in all: a thread stuck in the kernel on
        a file (a hung network mount) is left behind, a daemon that dies
        with the process."""
        for _ in self._threads:
            self._tasks.put((Priority.STOP, next(self._seq), None, None))
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread in self._threads)
        # Dropped tasks hold slices of the primary rows: let them go, or the
        # primary tier's mmap cannot be closed.
        dropped: dict[Priority, int] = {}
        while True:
            try:
                priority, _, _, _ = self._tasks.get_nowait()
            except queue.Empty:
                return PoolStopped(stuck, dropped)
            if priority is not Priority.STOP:
                dropped[priority] = dropped.get(priority, 0) + 1
            self._tasks.task_done()


@dataclass(frozen=True)
class PoolStopped:
    stuck_threads: int
    dropped: dict[Priority, int]
