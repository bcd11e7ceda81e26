"""The floors a restore is compared with: memory copy and disk read bandwidth.

The disk read is measured the way the disk tier reads (block-sized O_DIRECT
reads of separate files on as many threads, page cache dropped); timings
are best-of-N, the figure least disturbed on a shared machine.
"""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vllm_uma.kv_offload.mover import default_copy_threads


def best_of(repeats: int, fn) -> float:
    """The shortest of ``repeats`` timed calls, in seconds: on a shared
    machine the minimum is the figure least disturbed by others."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_gbps(nbytes: int, repeats: int = 5, threads: int | None = None) -> float:
    """numpy's copy of one contiguous buffer, cut in ``threads`` equal parts
    copied at once: the floor for moving bytes in RAM at the mover's
    parallelism (its ``default_copy_threads`` unless told)."""
    threads = threads or default_copy_threads()
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    bounds = np.linspace(0, nbytes, threads + 1).astype(int)
    parts = list(zip(bounds, bounds[1:], strict=False))
    if threads == 1:
        return nbytes / best_of(repeats, lambda: np.copyto(dst, src)) / 1e9
    with ThreadPoolExecutor(max_workers=threads) as pool:

        def copy() -> None:
            # numpy drops the GIL while it copies: the parts run in parallel.
            list(pool.map(lambda ab: np.copyto(dst[ab[0] : ab[1]], src[ab[0] : ab[1]]), parts))

        return nbytes / best_of(repeats, copy) / 1e9


def drop_page_cache(path: Path) -> int:
    """Evict ``path`` (a file, or every file under a directory) from the page
    cache so that the next read comes from the disk. Returns the bytes
    dropped. Dirty pages cannot be dropped, so everything is synced first."""
    os.sync()
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    dropped = 0
    for file in files:
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile, or not ours to read
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return dropped


def disk_tier_read_gbps(directory: Path, row_bytes: int, nbytes: int, threads: int) -> float:
    """A reference for the disk tier's restores: the disk read the way the
    tier reads. ``nbytes`` in separate files of one page plus ``row_bytes``
    (a block file: header page, one KV block), page cache dropped, each read
    whole with one O_DIRECT pread into a page-aligned buffer, ``threads`` at
    a time. No checksum, no copy into the pool: what the tier could reach if
    the disk were its only cost. Buffered reads where the volume refuses
    O_DIRECT (tmpfs), as the tier does."""
    page = mmap.PAGESIZE
    size = page + -(-row_bytes // page) * page
    count = max(threads, nbytes // size)
    work = directory / f".disk-tier-probe-{os.getpid()}"
    work.mkdir()
    direct = getattr(os, "O_DIRECT", 0)
    try:
        block = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
        for i in range(count):
            (work / f"{i}.kvb").write_bytes(block)
        drop_page_cache(work)
        buffers = [mmap.mmap(-1, size) for _ in range(threads)]

        def read(i: int) -> int:
            buf = buffers[i % threads]
            path = work / f"{i}.kvb"
            try:
                fd = os.open(path, os.O_RDONLY | direct)
            except OSError:
                fd = os.open(path, os.O_RDONLY)  # no O_DIRECT here: buffered
            try:
                return os.preadv(fd, [buf], 0)
            finally:
                os.close(fd)

        # Thread i reads files i, i + threads, ...: one buffer per thread.
        def worker(t: int) -> int:
            return sum(read(i) for i in range(t, count, threads))

        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            done = sum(pool.map(worker, range(threads)))
        took = time.perf_counter() - start
        for buf in buffers:
            buf.close()
        return done / took / 1e9
    finally:
        for path in work.glob("*"):
            path.unlink()
        work.rmdir()
