"""L3: what passes between the disk tier and its I/O threads, and back.

Engine-core process. The disk tier (scheduler thread) hands the I/O threads
one ``BlockIO`` per block file; the task that runs it (io_tasks.py) answers
with one ``Outcome``, which the scheduler thread applies (completion.py).
What crosses the boundary: paths, keys, memoryview slices of the primary
rows (which vLLM keeps pinned until the job's result is returned), outcomes.
All are frozen but a load's ``Ticket``, which both sides claim under its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from vllm_uma.kv_offload.disk.block_file import BadReason, FileId
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.mac_keys import KeySource


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
    # The MAC keys of signed block files (block_mac.py); None: unsigned.
    keys: KeySource | None = None


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
    seen: FileId | None = None  # a bad block's delete: the file its load found (None: none)

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
    seen: FileId | None = None  # a load's bad block: the file found bad (None: none)


def failed(io: BlockIO, failure: BadReason | StoreFailure | Refusal, detail: str) -> Outcome:
    """``io`` did nothing, for ``failure``; ``detail`` is for the warning."""
    return Outcome(io.job_id, io.ref, False, failure, detail)
