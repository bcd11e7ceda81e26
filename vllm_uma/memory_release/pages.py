"""Give byte ranges of this process's memory back to the kernel (madvise).

Two kinds of mapping hold KV here, and each needs its own advice:

- vLLM's KV cache (L1) is private anonymous memory (torch's allocator maps
  the multi-GiB buffer with mmap). ``MADV_DONTNEED`` drops its pages at
  once; the next touch maps a zeroed page.
- The host pool (L2) is a MAP_SHARED anonymous mapping, i.e. shmem. There
  ``MADV_DONTNEED`` only unmaps the pages from this process and the shmem
  keeps them; ``MADV_REMOVE`` frees the backing pages.

Why DONTNEED and not MADV_FREE for L1 (measured here, 2 GiB written then
given back in 96 KiB pieces, /tmp/madv.py in the issue 14 notes): DONTNEED
took 6 us a call and RSS fell from 2.03 to 0.03 GiB at once; MADV_FREE took
20 us a call and RSS did not move: the kernel frees such pages only when it
needs them, so they still count against the process, its cgroup and
MemAvailable, which are exactly what a machine under pressure and the
pressure watch (pressure.py) look at. FREE's gain, a reuse without a page
fault when the kernel did not take the page, is worth little for a block
whose prefix was evicted: it is rewritten from scratch anyway.

Only whole pages inside a range are given back: a range is rounded inward
to page boundaries, so bytes of a neighbouring block that shares a page are
never zeroed.

What went back is counted exactly: mincore(2) says which of the pages were
resident just before the advice. (The process's VmRSS would also count what
other threads allocate meanwhile, e.g. a forward writing new KV blocks while
a pressure pass runs, and the kernel updates it in per-thread batches.)

The other way, ``populate``: ``MADV_POPULATE_WRITE`` (Linux 5.14) faults
pages in as a write would, without writing them, so it is safe on pages
another thread may be writing at the same moment (warm_reserve.py), and on
a neighbour's bytes: a range is rounded outward to page boundaries, so the
pages a block shares with its neighbours (vLLM's KV buffer need not start
on a page) are faulted in too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")
MADV_DONTNEED = mmap.MADV_DONTNEED
MADV_REMOVE = mmap.MADV_REMOVE
# <linux/mman.h>; Python's mmap module names it from 3.13 on only.
MADV_POPULATE_WRITE = 23

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.madvise.restype = ctypes.c_int
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_LIBC.mincore.restype = ctypes.c_int

Range = tuple[int, int]  # [start, end) addresses in bytes


class MadviseError(OSError):
    """The kernel refused to take pages back, or to fault them in."""


def inward(start: int, end: int, page: int = PAGE) -> Range | None:
    """The whole pages inside [start, end), or None if there are none."""
    first = -(-start // page) * page
    last = end // page * page
    return (first, last) if last > first else None


def outward(start: int, end: int, page: int = PAGE) -> Range | None:
    """The pages that hold any byte of [start, end), or None if it is empty."""
    if end <= start:
        return None
    return start // page * page, -(-end // page) * page


def merge(ranges: Iterable[Range]) -> list[Range]:
    """Sorted ranges with touching or overlapping ones joined, so runs of
    adjacent blocks cost one system call."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def resident_bytes(start: int, end: int) -> int:
    """Bytes of the page-aligned range [start, end) resident now (mincore)."""
    count = (end - start) // PAGE
    if count <= 0:
        return 0
    vector = (ctypes.c_ubyte * count)()
    if _LIBC.mincore(start, end - start, vector) != 0:
        err = ctypes.get_errno()
        raise MadviseError(err, f"mincore({start:#x}, {end - start}) failed: {os.strerror(err)}")
    # Bit 0 of each byte: the page is resident (the other bits are undefined).
    return int(np.count_nonzero(np.frombuffer(vector, dtype=np.uint8) & 1)) * PAGE


def give_back(ranges: Iterable[Range], advice: int = MADV_DONTNEED) -> int:
    """madvise each range's whole pages; the bytes of them that were resident.

    The ranges are merged first and rounded inward per merged range.
    """
    given = 0
    for start, end in merge(ranges):
        pages = inward(start, end)
        if pages is None:
            continue
        given += resident_bytes(*pages)
        length = pages[1] - pages[0]
        if _LIBC.madvise(pages[0], length, advice) != 0:
            err = ctypes.get_errno()
            raise MadviseError(
                err,
                f"madvise({pages[0]:#x}, {length}, {advice}) failed: {os.strerror(err)}",
            )
    return given


def populate(ranges: Iterable[Range]) -> int:
    """Fault in every page that holds a byte of the ranges, without writing
    them; the bytes that were not resident before. Raises MadviseError where
    the kernel has no MADV_POPULATE_WRITE (EINVAL before Linux 5.14) or
    cannot find the memory (ENOMEM: the machine is out of it)."""
    made = 0
    for start, end in merge(ranges):
        pages = outward(start, end)
        if pages is None:
            continue
        missing = (pages[1] - pages[0]) - resident_bytes(*pages)
        if missing == 0:
            continue  # nothing to fault in: a page-table walk saved
        length = pages[1] - pages[0]
        if _LIBC.madvise(pages[0], length, MADV_POPULATE_WRITE) != 0:
            err = ctypes.get_errno()
            raise MadviseError(
                err,
                f"madvise({pages[0]:#x}, {length}, MADV_POPULATE_WRITE) failed: {os.strerror(err)}",
            )
        made += missing
    return made
