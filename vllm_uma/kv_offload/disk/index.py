"""L3: this server's view of the disk store, for lookups without a syscall.

Pure Python, no I/O: the disk tier keeps one ``DiskIndex`` on the scheduler
thread of the engine-core process and applies every change there (the I/O
threads and the ledger feed only report), so it needs no lock.

It mirrors the shared ledger (ledger/) for this tier's namespace: what is
present (lookups answer from it), what this server is writing (a second
store of the same block is skipped), and which blocks a load of ours is
reading (``pinned``: stores of this process never evict them). The cap and
the eviction order live in the ledger, where every server on the store sees
them.

Every entry carries a serial, new for each ``begin_store``/``add_present``:
an outcome that arrives after its block was removed and stored again cannot
unpin or remove the newer block. A block's state (``BlockState``) is the
same enum here and in the ledger.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Generic, TypeVar


# The states of a block, one enum for this index (WRITING and PRESENT) and
# the shared ledger (all three). SQLite stores the int value in
# ``blocks.state``: the numbers are part of the ledger's on-disk format, read
# by every server on the store, and must never be renumbered.
class BlockState(IntEnum):
    WRITING = 0  # reserved, bytes on their way to a temp file
    PRESENT = 1  # the final file exists and may be loaded
    # Ledger only: a victim whose file is being unlinked; still counted, and
    # its name taken, so that no store lands under it before the unlink.
    DELETING = 2

    @property
    def label(self) -> str:
        """The metric label of a store skipped for this state ("writing", ...)."""
        return self.name.lower()


Name = TypeVar("Name", bound=Hashable)


@dataclass(slots=True)
class _Entry:
    size: int
    state: BlockState
    serial: int
    pins: int = 0


class DiskIndex(Generic[Name]):
    def __init__(self) -> None:
        self._entries: dict[Name, _Entry] = {}
        self._next_serial = 0
        # Names with a load in flight; read by the I/O threads (a set's
        # ``in`` is atomic under the GIL), written here only.
        self.pinned: set[Name] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Name]:
        return iter(list(self._entries))

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

    def add_present(self, name: Name, size: int) -> bool:
        """A block found at start-up or stored by another server; False if
        the index holds the name already."""
        if name in self._entries:
            return False
        self._add(name, size, BlockState.PRESENT)
        return True

    # -- our stores ---------------------------------------------------------

    def begin_store(self, name: Name, size: int) -> None:
        self._add(name, size, BlockState.WRITING)

    def commit(self, name: Name) -> None:
        """The block file is complete under its final name."""
        self._writing(name).state = BlockState.PRESENT

    def abort(self, name: Name) -> None:
        """The store wrote nothing (or the name was another's): forget it."""
        self._writing(name)
        del self._entries[name]

    def _writing(self, name: Name) -> _Entry:
        entry = self._entries.get(name)
        if entry is None or entry.state is not BlockState.WRITING:
            raise KeyError(f"{name!r} has no store in flight")
        return entry

    # -- our loads ----------------------------------------------------------

    def pin(self, name: Name) -> int | None:
        """Protect a PRESENT block from our own evictions while it is read;
        returns the serial to unpin with, or None if it is not loadable."""
        entry = self._entries.get(name)
        if entry is None or entry.state is not BlockState.PRESENT:
            return None
        entry.pins += 1
        self.pinned.add(name)
        return entry.serial

    def unpin(self, name: Name, serial: int) -> None:
        entry = self._current(name, serial)
        if entry is not None:
            entry.pins -= 1
            if entry.pins == 0:
                self.pinned.discard(name)

    def remove(self, name: Name, serial: int | None = None) -> int | None:
        """Forget a present block (evicted, gone or bad, pinned or not);
        returns its size, or None if the index holds no such block (of
        ``serial``)."""
        entry = self._current(name, serial)
        if entry is None or entry.state is not BlockState.PRESENT:
            return None
        del self._entries[name]
        self.pinned.discard(name)
        return entry.size

    def _current(self, name: Name, serial: int | None) -> _Entry | None:
        entry = self._entries.get(name)
        if entry is None or (serial is not None and entry.serial != serial):
            return None
        return entry
