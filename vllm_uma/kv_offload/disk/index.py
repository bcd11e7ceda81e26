"""L3 bookkeeping: which block files exist, how big, and which go first.

Pure Python, no I/O: the disk tier keeps one ``DiskIndex`` on the scheduler
thread of the engine-core process and applies every change there (the I/O
threads only report outcomes), so it needs no lock.

Order is least recently stored-or-restored first: a store takes the most
recent end when it is reserved (and keeps that place when it commits, so the
order does not depend on which I/O thread finishes first), a restore (or an
L1 hit the manager reports through ``touch``) moves the block there again.
Files found at start-up enter oldest mtime first, and the tier bumps a
file's mtime when it restores it, so the order survives a restart.

Invariants:
- ``used_bytes`` is the sum of the sizes of all entries, WRITING ones
  included (their bytes are landing on disk now), and never exceeds the cap
  after a ``reserve`` (start-up scans may exceed it until ``evict_to_cap``).
- A WRITING entry or a pinned one (a load in flight) is never a victim.
- Every entry carries a serial, new for each ``reserve``/``add_existing``:
  an outcome that arrives after its block was removed and stored again
  cannot unpin or remove the newer block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

Name = TypeVar("Name", bound=Hashable)


class BlockState(Enum):
    WRITING = "writing"  # reserved, bytes on their way to a temp file
    PRESENT = "present"  # the final file exists and may be loaded


class Refusal(Enum):
    """Why ``reserve`` cannot make room (also the metric label)."""

    TOO_BIG = "too_big"  # the block alone is larger than the cap
    NO_ROOM = "no_room"  # the rest is pinned or being written right now


@dataclass(slots=True)
class _Entry:
    size: int
    state: BlockState
    serial: int
    pins: int = 0


class DiskIndex(Generic[Name]):
    def __init__(self, cap_bytes: int | None):
        if cap_bytes is not None and cap_bytes <= 0:
            raise ValueError(f"cap_bytes={cap_bytes} is invalid: use None for no cap, or > 0")
        self.cap_bytes = cap_bytes
        self.used_bytes = 0
        # Iteration order = eviction order: the first entry goes first.
        self._entries: OrderedDict[Name, _Entry] = OrderedDict()
        self._next_serial = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Name]:
        """Names in eviction order (least recent first)."""
        return iter(self._entries)

    def state(self, name: Name) -> BlockState | None:
        entry = self._entries.get(name)
        return None if entry is None else entry.state

    def is_present(self, name: Name) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.state is BlockState.PRESENT

    def _add(self, name: Name, size: int, state: BlockState) -> None:
        if name in self._entries:
            raise KeyError(f"{name!r} is already in the disk index")
        self._next_serial += 1
        self._entries[name] = _Entry(size, state, self._next_serial)
        self.used_bytes += size

    # -- start-up ---------------------------------------------------------

    def add_existing(self, name: Name, size: int) -> None:
        """A file found on disk; call in mtime order, oldest first."""
        self._add(name, size, BlockState.PRESENT)

    def evict_to_cap(self) -> list[tuple[Name, int]]:
        """Remove least recent unpinned blocks until within the cap; the
        caller deletes their files."""
        return self._take_victims(0) or []

    # -- stores -------------------------------------------------------------

    def reserve(self, name: Name, size: int) -> list[tuple[Name, int]] | Refusal:
        """Make room for ``size`` bytes and add ``name`` as WRITING.

        Returns the victims, least recent first, already removed from the
        index (the caller deletes their files), or a Refusal with nothing
        changed."""
        if self.cap_bytes is not None and size > self.cap_bytes:
            return Refusal.TOO_BIG
        victims = self._take_victims(size)
        if victims is None:
            return Refusal.NO_ROOM
        self._add(name, size, BlockState.WRITING)
        return victims

    def commit(self, name: Name) -> None:
        """The block file is complete under its final name."""
        self._writing(name).state = BlockState.PRESENT

    def abort(self, name: Name) -> None:
        """The store failed: nothing is on disk, release the bytes."""
        self._writing(name)
        self.used_bytes -= self._entries.pop(name).size

    def _writing(self, name: Name) -> _Entry:
        entry = self._entries.get(name)
        if entry is None or entry.state is not BlockState.WRITING:
            raise KeyError(f"{name!r} has no store in flight")
        return entry

    def _take_victims(self, size: int) -> list[tuple[Name, int]] | None:
        if self.cap_bytes is None:
            return []
        excess = self.used_bytes + size - self.cap_bytes
        if excess <= 0:
            return []
        chosen: list[Name] = []
        freed = 0
        for name, entry in self._entries.items():
            if entry.state is BlockState.PRESENT and entry.pins == 0:
                chosen.append(name)
                freed += entry.size
                if freed >= excess:
                    break
        if freed < excess:
            return None
        victims = [(name, self._entries.pop(name).size) for name in chosen]
        self.used_bytes -= freed
        return victims

    # -- loads --------------------------------------------------------------

    def pin(self, name: Name) -> int | None:
        """Protect a PRESENT block from eviction while it is read; returns the
        serial to unpin with, or None if the block is not loadable."""
        entry = self._entries.get(name)
        if entry is None or entry.state is not BlockState.PRESENT:
            return None
        entry.pins += 1
        return entry.serial

    def unpin(self, name: Name, serial: int) -> None:
        entry = self._current(name, serial)
        if entry is not None:
            entry.pins -= 1

    def touch(self, name: Name) -> None:
        """The block was restored or used: it goes last."""
        if self.is_present(name):
            self._entries.move_to_end(name)

    def remove(self, name: Name, serial: int | None = None) -> int | None:
        """Forget a block whose file is gone or bad (pinned or not); returns
        its size, or None if the index holds no such block (of ``serial``)."""
        entry = self._current(name, serial)
        if entry is None or entry.state is not BlockState.PRESENT:
            return None
        del self._entries[name]
        self.used_bytes -= entry.size
        return entry.size

    def _current(self, name: Name, serial: int | None) -> _Entry | None:
        entry = self._entries.get(name)
        if entry is None or (serial is not None and entry.serial != serial):
            return None
        return entry
