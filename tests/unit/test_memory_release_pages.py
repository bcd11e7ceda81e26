"""Giving byte ranges back to the kernel (vllm_uma/memory_release/pages.py).

The rounding and merging are checked on plain numbers; ``give_back`` on real
memory: a private anonymous buffer like vLLM's KV cache (L1, MADV_DONTNEED)
and a real HostPool, the MAP_SHARED anonymous mapping of L2 (MADV_REMOVE).
What went back is the kernel's own figure, VmRSS (which counts RssShmem).
"""

from __future__ import annotations

import errno
import mmap

import numpy as np
import pytest

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.memory_release.pages import (
    MADV_DONTNEED,
    MADV_REMOVE,
    PAGE,
    MadviseError,
    give_back,
    inward,
    merge,
    populate,
    resident_bytes,
)


def process_rss() -> int:
    """VmRSS: the kernel's count of this process's resident memory."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


MiB = 1 << 20
RSS_SLACK = 4 * MiB  # other allocations of this process between two readings


def private_buffer(pages: int) -> np.ndarray:
    """A page-aligned private anonymous mapping, filled with non-zero bytes
    that differ from page to page and within a page."""
    region = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = np.frombuffer(region, dtype=np.uint8)
    buf[:] = np.arange(buf.size) % 251 + 1
    return buf


def test_inward_rounds_the_start_up_and_the_end_down():
    assert inward(0, 8192, page=4096) == (0, 8192)
    assert inward(1, 8192, page=4096) == (4096, 8192)
    assert inward(4095, 8193, page=4096) == (4096, 8192)
    assert inward(100, 20000, page=4096) == (4096, 16384)
    assert inward(4096, 12287, page=4096) == (4096, 8192)


def test_inward_is_none_without_a_whole_page():
    assert inward(4096, 8191, page=4096) is None  # one byte short
    assert inward(4097, 8192, page=4096) is None
    assert inward(5000, 7000, page=4096) is None  # inside one page
    assert inward(4000, 5000, page=4096) is None  # across a boundary, no whole page
    assert inward(8192, 8192, page=4096) is None  # empty


def test_merge_joins_touching_and_overlapping_ranges_in_order():
    assert merge([(50, 60), (10, 20), (20, 30), (5, 8), (25, 40)]) == [
        (5, 8),
        (10, 40),
        (50, 60),
    ]
    assert merge([(0, 100), (10, 20)]) == [(0, 100)]  # contained
    assert merge([(0, 10), (11, 20)]) == [(0, 10), (11, 20)]  # a one-byte gap stays
    assert merge([]) == []


def test_given_back_pages_leave_rss_and_read_as_zeros():
    buf = np.empty(66 * MiB, dtype=np.uint8)  # malloc'd: not page-aligned
    buf[:] = 0xA5
    base = buf.ctypes.data
    aligned = -(-base // PAGE) * PAGE
    start, end = aligned + MiB + 100, aligned + 65 * MiB + 100
    before = process_rss()
    advised = give_back([(start, end)])
    dropped = before - process_rss()
    # 100 bytes past a boundary at both ends: the first partial page stays.
    assert advised == 64 * MiB - PAGE
    assert abs(dropped - advised) < RSS_SLACK, f"RSS fell {dropped / MiB:.1f} MiB"
    lo, hi = aligned + MiB + PAGE - base, aligned + 65 * MiB - base
    assert not buf[lo:hi].any()
    # The partial pages at both edges, inside the range, keep their bytes.
    assert (buf[:lo] == 0xA5).all() and (buf[hi:] == 0xA5).all()
    assert buf[start - base : lo].size == PAGE - 100 and buf[hi : end - base].size == 100


def test_a_range_off_page_boundaries_never_zeroes_a_neighbours_bytes():
    buf = private_buffer(8)
    kept = buf.copy()
    base = buf.ctypes.data
    assert give_back([(base + PAGE // 2, base + 5 * PAGE + 100)]) == 4 * PAGE
    kept[PAGE : 5 * PAGE] = 0
    assert np.array_equal(buf, kept)
    # Less than a page inside the range: nothing is advised, nothing changes.
    assert give_back([(base + 6 * PAGE + 1, base + 7 * PAGE)]) == 0
    assert give_back([(base + 5 * PAGE + 200, base + 6 * PAGE + 300)]) == 0
    assert np.array_equal(buf, kept)


def test_ranges_are_merged_before_they_are_rounded():
    # Two half-page-aligned neighbours: alone neither holds a whole page,
    # together they hold page 1.
    buf = private_buffer(4)
    kept = buf.copy()
    base = buf.ctypes.data
    halves = [
        (base + PAGE // 2, base + 3 * PAGE // 2),
        (base + 3 * PAGE // 2, base + 5 * PAGE // 2),
    ]
    assert give_back(halves) == PAGE
    kept[PAGE : 2 * PAGE] = 0
    assert np.array_equal(buf, kept)


def test_madv_remove_frees_host_pool_rows_and_keeps_the_others():
    pool = HostPool(16, 2 * MiB)
    for row in range(16):
        pool.array[row] = row + 1
    base, size = pool.array.ctypes.data, pool.row_bytes
    gone = (3, 4, 5, 9)
    before = process_rss()
    advised = give_back([(base + r * size, base + (r + 1) * size) for r in gone], MADV_REMOVE)
    dropped = before - process_rss()
    assert advised == 4 * size
    assert abs(dropped - 4 * size) < RSS_SLACK, f"RSS fell {dropped / MiB:.1f} MiB"
    for row in range(16):
        assert (pool.array[row] == (0 if row in gone else row + 1)).all(), row
    pool.close()


def test_dontneed_on_the_shared_pool_keeps_the_bytes():
    # Why the pool needs MADV_REMOVE: DONTNEED only unmaps shmem pages from
    # this process; the next read finds the same bytes, still in RAM.
    pool = HostPool(2, 64 * PAGE)
    pool.array[0] = 7
    base = pool.array.ctypes.data
    assert give_back([(base, base + pool.row_bytes)], MADV_DONTNEED) == pool.row_bytes
    assert (pool.array[0] == 7).all()
    pool.close()


def test_an_unmapped_range_raises_madvise_error():
    # Page 0 is never mapped (vm.mmap_min_addr).
    with pytest.raises(MadviseError) as err:
        give_back([(0, 4 * PAGE)])
    assert err.value.errno == errno.ENOMEM
    assert f"mincore(0x0, {4 * PAGE}) failed" in str(err.value)  # asked first


def test_madv_remove_on_private_memory_raises_madvise_error():
    buf = private_buffer(2)
    base = buf.ctypes.data
    with pytest.raises(MadviseError) as err:
        give_back([(base, base + PAGE)], MADV_REMOVE)
    assert err.value.errno == errno.EINVAL
    assert (buf[:PAGE] != 0).all()  # nothing was given back


def test_give_back_counts_only_the_pages_that_were_resident():
    # 8 pages mapped, 3 written: mincore says 3 were resident, and after the
    # advice none is; a second advice of the same pages gives back nothing.
    region = mmap.mmap(-1, 8 * PAGE)
    base = np.frombuffer(region, dtype=np.uint8).ctypes.data
    view = np.frombuffer(region, dtype=np.uint8)
    for page in (1, 4, 6):
        view[page * PAGE] = 7
    assert resident_bytes(base, base + 8 * PAGE) == 3 * PAGE
    assert give_back([(base, base + 8 * PAGE)], MADV_REMOVE) == 3 * PAGE
    assert resident_bytes(base, base + 8 * PAGE) == 0
    assert give_back([(base, base + 8 * PAGE)], MADV_REMOVE) == 0
    del view
    region.close()


def test_populate_makes_pages_resident_without_changing_a_byte():
    # 8 pages, 3 written: populate faults in the other 5 and reports them;
    # the written bytes stay, the others read zero as before.
    region = mmap.mmap(-1, 8 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = np.frombuffer(region, dtype=np.uint8)
    base = view.ctypes.data
    for page in (1, 4, 6):
        view[page * PAGE : (page + 1) * PAGE] = page + 1
    assert populate([(base, base + 8 * PAGE)]) == 5 * PAGE
    assert resident_bytes(base, base + 8 * PAGE) == 8 * PAGE
    for page in range(8):
        expected = page + 1 if page in (1, 4, 6) else 0
        assert (view[page * PAGE : (page + 1) * PAGE] == expected).all(), page
    assert populate([(base, base + 8 * PAGE)]) == 0  # nothing left to fault in
    del view
    region.close()


def test_populate_of_the_shared_pool_counts_and_keeps_its_rows():
    pool = HostPool(2, 4 * PAGE)
    pool.array[0] = 9
    base = pool.array.ctypes.data
    assert populate([(base, base + 8 * PAGE)]) == 4 * PAGE
    assert (pool.array[0] == 9).all() and not pool.array[1].any()
    pool.close()


def test_populate_of_an_unmapped_range_raises_madvise_error():
    with pytest.raises(MadviseError) as err:
        populate([(0, 4 * PAGE)])
    assert err.value.errno == errno.ENOMEM


def test_populate_of_read_only_memory_raises_madvise_error():
    region = mmap.mmap(
        -1, 2 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ
    )
    base = np.frombuffer(region, dtype=np.uint8).ctypes.data
    with pytest.raises(MadviseError) as err:
        populate([(base, base + 2 * PAGE)])
    assert "MADV_POPULATE_WRITE" in str(err.value)
    region.close()


def test_populate_faults_in_the_pages_a_range_shares_with_its_neighbours():
    # A range from the middle of page 1 to the middle of page 4: pages 1-4
    # hold its bytes, and all four are faulted in (give_back would take
    # only 2 and 3: the others hold a neighbour's bytes too).
    region = mmap.mmap(-1, 8 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(region, dtype=np.uint8).ctypes.data
    assert populate([(base + PAGE + 100, base + 4 * PAGE + 100)]) == 4 * PAGE
    assert resident_bytes(base + PAGE, base + 5 * PAGE) == 4 * PAGE
    assert (
        resident_bytes(base, base + PAGE) == resident_bytes(base + 5 * PAGE, base + 8 * PAGE) == 0
    )
    region.close()
