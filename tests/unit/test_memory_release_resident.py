"""Reading a process's resident KV from smaps (vllm_uma/memory_release/resident.py).

Checked on this test process's own mappings: a private anonymous one
standing for the KV cache and a shared anonymous one (as the host pool),
with a known number of pages written in each.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from vllm_uma.memory_release.pages import PAGE
from vllm_uma.memory_release.resident import kv_resident

ROW = 5 * PAGE


def test_resident_pages_of_the_kv_cache_and_the_pool_are_counted_exactly():
    # Odd sizes, so no other mapping of this process matches them.
    kv_bytes, pool_bytes = 4099 * PAGE, 7 * ROW + 3 * PAGE  # pool: 7 whole rows
    kv = mmap.mmap(-1, kv_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # Flags of its own keep the kernel from merging it with an anonymous
    # neighbour (which an earlier test in this process may have left): the
    # merged mapping would be within the size slack and count its pages too.
    kv.madvise(mmap.MADV_DONTFORK)
    pool = mmap.mmap(-1, 7 * ROW)  # MAP_SHARED | MAP_ANONYMOUS, like HostPool
    views = [np.frombuffer(kv, dtype=np.uint8), np.frombuffer(pool, dtype=np.uint8)]
    try:
        views[0][: 10 * PAGE : PAGE] = 1  # 10 pages
        views[1][: 2 * ROW] = 1  # 2 rows
        found = kv_resident(os.getpid(), kv_bytes, pool_bytes, ROW)
        assert (found.found_l1, found.found_pool) == (True, True)
        assert (found.l1, found.pool, found.total) == (10 * PAGE, 2 * ROW, 10 * PAGE + 2 * ROW)
        # A pool a whole row smaller than the breakdown's figure is another mapping.
        assert not kv_resident(os.getpid(), kv_bytes, 8 * ROW + 3 * PAGE, ROW).found_pool
    finally:
        del views
        kv.close()
        pool.close()


def test_nothing_found_is_said():
    found = kv_resident(os.getpid(), 1 << 40, 77 * PAGE, PAGE)  # no 1 TiB mapping here
    assert (found.found_l1, found.found_pool, found.total) == (False, False, 0)


def test_a_kv_cache_in_a_mapping_rounded_and_aligned_for_huge_pages_is_found():
    # What a server showed: a 21,012,480,000-byte KV cache in a mapping
    # 3,149,824 B larger (the size rounded up to 2 MiB, 2 MiB of alignment,
    # 68 KiB of header). Here a mapping as much larger than the asked size.
    asked = 4099 * PAGE
    extra = 3_149_824
    kv = mmap.mmap(-1, asked + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    kv.madvise(mmap.MADV_DONTFORK)  # no merge with a neighbour (first test)
    try:
        assert kv_resident(os.getpid(), asked, 1 << 40, PAGE).found_l1
    finally:
        kv.close()
