"""L3 I/O tasks: one block file stored, loaded or deleted, and the threads that run them.

Runs on the disk tier's I/O threads (engine-core process), the only place
the tier touches block files while serving: the lower tier's threads
(lower_tier/threads.py), every one taking loads first, then deletes, then
stores. A task never raises and never touches the index: it does the I/O,
keeps the shared ledger (ledger/) and says what happened in an ``Outcome``
(io_descriptors.py); the scheduler thread applies it (completion.py).

Threads: several reads in flight keep the disk's queue full while other
threads checksum (the checksum and the syscalls release the GIL). Measured
here (2 cores shared with other work, virtio disk, 360 KiB blocks, page
cache dropped, checksums on) with format version 1's zlib.crc32: 1 thread
restored 0.6-0.7 GB/s, 2 threads 0.9-1.0, 4 threads 1.0-1.4, 8 threads
1.0-1.6, 16 threads 0.9-1.5. Past 4 the restore was bound by CPU (about
220 us per block: 90 crc32, 70 kernel, the rest Python), not by the disk;
8 keep a faster disk (NVMe) busy too. Version 2's CRC-32C checks such a
block in 15-30 us at its measured speed (block_file.py), not yet measured
in a restore. No thread runs loads only: a store takes milliseconds, so a
load waits at most for the stores in hand (the network tier's can take a
timeout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import queue
import sqlite3
import time
from collections.abc import Callable

from vllm_uma.kv_offload.disk.block_file import PROCESS_ERRNOS, BadBlock, BadReason, file_bytes
from vllm_uma.kv_offload.disk.block_read import read_block
from vllm_uma.kv_offload.disk.block_write import write_block
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.io_descriptors import BlockIO, Outcome, StoreFailure, failed
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.db import is_disk_full
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.lower_tier.threads import TierThreads
from vllm_uma.kv_offload.mac_keys import KeyRing

DEFAULT_IO_THREADS = 8


def start_io_threads(num_threads: int, outcomes: queue.SimpleQueue) -> TierThreads[BlockIO]:
    """The tier's I/O threads, ``uma-kv-disk-{i}``: each task's ``Outcome``
    on ``outcomes``; a task dropped at a stop gives none (counted)."""
    return TierThreads(
        "uma-kv-disk",
        num_threads,
        outcomes,
        failed=lambda io, exc: failed(io, StoreFailure.IO_ERROR, repr(exc)),
        setting="io_threads",
    )


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
        return failed(io, _ledger_failure(exc), f"ledger {shared.ledger.path}: {exc}")
    if isinstance(reserved, Refusal):
        return failed(io, reserved, reserved.value)
    if isinstance(reserved, BlockState):  # another store holds the name
        return Outcome(io.job_id, io.ref, True, taken=reserved)
    done = dict(victims=tuple(ref for ref, _ in reserved), unlink_errors=tuple(errors))
    failure = _write_and_commit(io, size)
    if failure is not None:
        return Outcome(io.job_id, io.ref, False, *failure, **done)
    end = time.perf_counter()
    return Outcome(io.job_id, io.ref, True, nbytes=io.row.nbytes, start=start, end=end, **done)


def _write_and_commit(io: BlockIO, size: int) -> tuple[StoreFailure, str] | None:
    """The file written under its reserved name and committed in the ledger;
    else why not (the failure and its detail), the reservation aborted."""
    assert io.row is not None
    shared = io.shared
    try:
        with shared.layout.block_dir(io.ref, create=True) as dir_fd:
            write_block(
                io.path,
                io.ref.key,
                io.ref.namespace,
                io.row,
                direct=io.direct,
                dir_fd=dir_fd,
                keys=_keys(shared),
            )
    except OSError as exc:
        shared.ledger.abort(io.ref, shared.writer)
        # Only the kernel's own word for "no room" is a full disk.
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        failure = StoreFailure.DISK_FULL if full else StoreFailure.IO_ERROR
        code = errno.errorcode.get(exc.errno or 0, "OSError")
        return failure, f"{code}: {exc.strerror or exc} ({io.path})"
    try:
        shared.ledger.commit(io.ref, size, io.stamp, shared.writer)
    except sqlite3.Error as exc:
        # Not in the ledger, so not counted: the file must go too.
        with contextlib.suppress(OSError):
            shared.layout.unlink(io.ref)
        shared.ledger.abort(io.ref, shared.writer)
        return _ledger_failure(exc), f"ledger {shared.ledger.path}: {exc}"
    return None


def _keys(shared) -> KeyRing | None:
    """The key ring of this task (a rotation lands between tasks), or None."""
    return None if shared.keys is None else shared.keys.keys()


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
    if is_disk_full(exc):
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
                io.path,
                io.ref.key,
                io.ref.namespace,
                io.row,
                direct=io.direct,
                dir_fd=dir_fd,
                keys=_keys(io.shared),
            )
            end = time.perf_counter()
            # Restored = recently used: the new mtime keeps the LRU order
            # across a restart. The file may be gone already (evicted after
            # this read); fine.
            with contextlib.suppress(OSError):
                os.utime(io.path.name, dir_fd=dir_fd, follow_symlinks=False)
    except BadBlock as bad:
        seen = bad.seen
        if seen is None and bad.reason is not BadReason.MISSING:
            seen = io.shared.layout.identity(io.ref)  # planted, refused at open
        return dataclasses.replace(failed(io, bad.reason, str(bad)), seen=seen)
    except FileNotFoundError:
        return failed(io, BadReason.MISSING, f"{io.path}: its directory is gone")
    except OSError as exc:
        if exc.errno in PROCESS_ERRNOS:
            # Out of descriptors or memory: a miss this time, the file is fine.
            return failed(io, StoreFailure.IO_ERROR, f"{io.path}: {exc}")
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            detail = f"{io.path}: a directory on its way is a symlink or not a directory"
            return failed(io, BadReason.NOT_A_FILE, detail)
        # fstat or fadvise failed: the file cannot be trusted either.
        return failed(io, BadReason.UNREADABLE, f"{io.path}: {exc}")
    return Outcome(io.job_id, io.ref, True, nbytes=io.row.nbytes, start=start, end=end)


def delete_task(io: BlockIO) -> Outcome:
    """Forget a bad block in the ledger and delete its file, in one
    transaction (no store of the same name can land in between). Only the
    file the load found bad (``io.seen``; None: it found none): if a peer
    evicted that one and stored a fresh copy meanwhile, the copy stays."""
    shared, errors = io.shared, []

    def still_bad(ref: BlockRef) -> bool:
        return shared.layout.identity(ref) == io.seen

    try:
        unlink = unlinker(shared.layout, errors)
        gone = shared.ledger.forget([io.ref], shared.writer, unlink, still_bad)
    except sqlite3.Error as exc:
        return failed(io, StoreFailure.LEDGER, f"ledger {shared.ledger.path}: {exc}")
    if errors:
        return failed(io, StoreFailure.IO_ERROR, errors[0])
    return Outcome(io.job_id, io.ref, True, freed=bool(gone))
