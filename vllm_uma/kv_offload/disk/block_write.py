"""L3: write one block file, atomically, by rename; whether O_DIRECT can be used.

Runs on the disk tier's I/O threads (engine-core process); nothing here
touches vLLM. The format is block_file.py's.

Writes are atomic by rename: a temp file ``<key hex>.kvb.<pid>-<random>.tmp``
in the same directory, created O_EXCL and 0600, renamed to the final name
once complete. A reader never sees half a file, and a crash leaves at most a
temp file that a later start-up deletes once its writer is gone
(store_scan.py). There is no fsync: after a power loss a renamed file may
hold zeros or stale bytes, and the checksum rejects it on load (the block is
then recomputed), which costs less than an fsync per block.

O_DIRECT moves a block between the disk and a primary-tier row without a
page-cache copy, which on a unified-memory machine would take RAM from the
KV tiers. Whether the rows and the volume take it is asked once, at the
disk tier's start-up (``is_direct_capable``, ``probe_direct``:
tier_startup.py); the I/O threads then open every block file with or
without it (here and in block_read.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
from pathlib import Path

from vllm_uma.kv_offload import block_mac
from vllm_uma.kv_offload.disk.block_file import (
    HEADER_BYTES,
    SAFE_OPEN,
    checksum,
    pack_header,
    temp_name,
)
from vllm_uma.kv_offload.mac_keys import KeyRing


def write_block(
    path: Path,
    key: bytes,
    namespace: bytes,
    payload: memoryview,
    *,
    direct: bool,
    dir_fd: int | None = None,
    keys: KeyRing | None = None,
) -> None:
    """Write ``payload`` as the block file ``path``, atomically (see the module
    docstring), signed with ``keys`` unless None (block_mac.py). ``direct``
    asks for O_DIRECT; it needs a direct-capable payload.
    With ``dir_fd`` (a handle on ``path``'s directory) only ``path.name`` is
    resolved, relative to it. Raises OSError (ENOSPC included) with nothing
    left under ``path``."""
    header = pack_header(key, namespace, checksum(payload), payload.nbytes)
    try:
        if keys is not None:
            # The row vLLM pinned for this store: it does not change under us.
            block_mac.sign(header, payload, keys)
        temp = path.with_name(temp_name(path.name))
        fd = _create_temp(temp, direct, dir_fd)
        try:
            _fill_and_rename(fd, temp, path, header, payload, dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(_name(temp, dir_fd), dir_fd=dir_fd)
            raise
    finally:
        header.close()


def _create_temp(temp: Path, direct: bool, dir_fd: int | None) -> int:
    # O_DIRECT: the block goes from the primary row to the disk without a
    # page-cache copy (measured: buffered writes leave 100% of the block in
    # the page cache, and posix_fadvise(DONTNEED) cannot drop dirty pages).
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | SAFE_OPEN | (O_DIRECT if direct else 0)
    if dir_fd is not None:
        return os.open(temp.name, flags, 0o600, dir_fd=dir_fd)
    try:
        return os.open(temp, flags, 0o600)
    except FileNotFoundError:
        # First block of this 2-hex subdirectory (or someone removed it).
        os.makedirs(temp.parent, mode=0o700, exist_ok=True)
        return os.open(temp, flags, 0o600)


def _fill_and_rename(
    fd: int, temp: Path, path: Path, header: mmap.mmap, payload: memoryview, dir_fd: int | None
) -> None:
    """Write header and payload into the open temp file ``fd`` (closing it),
    then rename the temp file to ``path``."""
    try:
        written = os.pwritev(fd, [header, payload], 0)
    finally:
        os.close(fd)
    if written != HEADER_BYTES + payload.nbytes:
        # No error, yet not every byte: a signal, or a quota or device
        # limit hit mid-write. Not proof of a full disk (ENOSPC says
        # that), so it fails this block only.
        raise OSError(errno.EIO, f"short write of {written} bytes", str(temp))
    # rename replaces whatever is under the name (even a planted FIFO or
    # symlink) without following it.
    os.rename(_name(temp, dir_fd), _name(path, dir_fd), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _name(path: Path, dir_fd: int | None) -> Path | str:
    """What to pass the kernel: the name relative to ``dir_fd``, else the path."""
    return path.name if dir_fd is not None else path


# O_DIRECT needs buffer address, length and file offset aligned to the
# device's logical block (512 B or 4 KiB); a page covers both.
DIRECT_ALIGN = mmap.PAGESIZE
O_DIRECT = getattr(os, "O_DIRECT", 0)


def is_direct_capable(buffer: memoryview) -> bool:
    """Whether ``buffer`` can take part in O_DIRECT I/O (page-aligned address
    and length, writable so that its address can be taken)."""
    if not O_DIRECT or buffer.readonly or buffer.nbytes % DIRECT_ALIGN:
        return False
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    return address % DIRECT_ALIGN == 0


def probe_direct(directory: Path) -> bool:
    """Whether files in ``directory`` accept O_DIRECT (ext4/xfs do; some
    overlay, network and older tmpfs mounts refuse it with EINVAL)."""
    if not O_DIRECT:
        return False
    path = directory / temp_name(".direct-probe")
    page = mmap.mmap(-1, DIRECT_ALIGN)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | O_DIRECT, 0o600)
        try:
            os.write(fd, page)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        page.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
