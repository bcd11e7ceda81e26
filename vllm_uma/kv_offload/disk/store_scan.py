"""L3 start-up scan: the block files a store holds, and its leftover temps.

Runs once in the engine-core process, when the disk tier is built (before
serving), so it may do blocking I/O; ``tree_bytes`` also runs in the API
server, for the settings' free-space check (settings.py). The walk follows the
directories layout.py lays out and never follows a symlink: a planted link,
FIFO or a name the tier would not make is not indexed, nor deleted.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.kv_offload.disk.block_file import (
    NAMESPACE_BYTES,
    is_temp_name,
    key_from_name,
    pid_is_alive,
    writer_pid,
)
from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.progress import Progress

# A temp file older than this is left over whatever its pid says (the pid
# may have been reused, or belong to another host's or container's writer).
STALE_TEMP_S = 3600


@dataclass(frozen=True)
class FoundBlock:
    ref: BlockRef
    size: int
    mtime_ns: int


def scan_store(noindex: Path) -> tuple[list[FoundBlock], int]:
    """Block files of every namespace under ``noindex``, oldest mtime first,
    and the number of leftover temp files deleted on the way."""
    found: list[FoundBlock] = []
    removed = 0
    progress = Progress("reading the store", "block files")
    for ns_entry in _entries(noindex):
        if is_temp_name(ns_entry.name):
            removed += _remove_stale_temp(ns_entry)
            continue
        namespace = _namespace_of(ns_entry)
        if namespace is None:
            continue
        for sub in _entries(Path(ns_entry.path)):
            if is_temp_name(sub.name):
                removed += _remove_stale_temp(sub)
            elif sub.is_dir(follow_symlinks=False) and len(sub.name) == 2:
                before = len(found)
                removed += _scan_subdir(namespace, sub, found)
                progress.advance(len(found) - before)
    found.sort(key=lambda block: block.mtime_ns)
    return found, removed


def _scan_subdir(namespace: bytes, sub: os.DirEntry, found: list[FoundBlock]) -> int:
    removed = 0
    for entry in _entries(Path(sub.path)):
        if is_temp_name(entry.name):
            removed += _remove_stale_temp(entry)
            continue
        key = key_from_name(entry.name)
        # A block file sits in the subdirectory its key names; anything
        # else is not ours to index (nor to delete).
        if key is None or not entry.name.startswith(sub.name):
            continue
        with contextlib.suppress(OSError):  # deleted meanwhile
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):  # a planted link or FIFO is no block
                found.append(FoundBlock(BlockRef(namespace, key), st.st_size, st.st_mtime_ns))
    return removed


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove_stale_temp(entry: os.DirEntry) -> int:
    """Delete a temp file whose write cannot be in flight any more: its
    writer's pid is gone, or it is over an hour old. Another live server's
    write (a restarted server starting while the old one drains) is kept.
    Returns 1 if it was removed, else 0 (for the start-up line's count)."""
    try:
        st = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or _may_be_in_flight(entry.name, st.st_mtime):
            return 0
        os.unlink(entry.path)
    except FileNotFoundError:
        return 0
    return 1


def _may_be_in_flight(name: str, mtime: float) -> bool:
    if time.time() - mtime > STALE_TEMP_S:
        return False
    pid = writer_pid(name)
    if pid is None or pid == os.getpid():
        return False  # an older format's temp, or our own earlier incarnation's
    return pid_is_alive(pid)


def _namespace_of(entry: os.DirEntry) -> bytes | None:
    if not entry.is_dir(follow_symlinks=False) or len(entry.name) != 2 * NAMESPACE_BYTES:
        return None
    try:
        namespace = bytes.fromhex(entry.name)
    except ValueError:
        return None
    # Only names the tier makes (lower-case hex): another spelling of the same
    # id would index files whose eviction then misses them.
    return namespace if namespace.hex() == entry.name else None


def tree_bytes(directory: Path) -> int:
    """Bytes of every file under ``directory`` (0 if it does not exist)."""
    total = 0
    for parent, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):  # deleted meanwhile
                total += os.lstat(os.path.join(parent, name)).st_size
    return total
