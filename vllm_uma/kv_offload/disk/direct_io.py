"""L3 O_DIRECT: whether a buffer and a directory can take part in it.

Engine-core process: the disk tier's start-up asks once (tier_startup.py),
and the I/O threads then open every block file with or without O_DIRECT
(block_write.py, block_read.py). O_DIRECT moves a block between the disk and
a primary-tier row without a page-cache copy, which on a unified-memory
machine would take RAM from the KV tiers.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from pathlib import Path

from vllm_uma.kv_offload.disk.block_file import temp_name

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
