"""The block checksum's speed, and whether it lets other threads run.

    .venv/bin/python -m tools.benchmark.checksum_speed [--sizes 737280 3670016] [--repeats 7]

The disk tier checksums every block it writes and every block it restores
(block_file.py), on its I/O threads, so the checksum must be fast on one
core and must release the GIL, or the threads take turns instead of running
on all cores. Each candidate checksums page-aligned buffers of random bytes
of a real block's size (by default at vllm-uma's default block of 32
tokens, plugin/block_size.py: the default model's, 737,280 B, and
Qwen3-0.6B's, 3,670,016 B; 4 times that at vLLM CPU's 128). Each speed is
the best of ``--repeats`` (the one least disturbed on a shared machine;
cold: of at most 3 passes):

- hot: one call on a buffer just checksummed (in the CPU's caches), in
  GB/s and microseconds per block;
- cold: each block of a 256 MiB set once, as a restore meets blocks fresh
  from the disk: bound by memory as much as by the checksum;
- 2 threads: two threads at once, each on its own hot buffer 4 times; the
  bytes of both over the wall time. Twice the hot figure needs 2 idle
  cores; on a busy machine this column cannot show the GIL, the next can;
- GIL: with Python's switch interval set to an hour, one thread makes
  100 calls on a hot block back to back while another sleeps 1 ms: how
  many had begun when the sleeper ran again (the most of 3 tries). It can
  run only when a call releases the GIL, so 100 means held and a few
  means released, however busy the machine (timings are not: on a busy
  machine a thread waits for a core as long as for the GIL).

``crc32c, GIL held`` (crc32c with ``gil_release_mode=0``) is the control:
what holding the GIL looks like in the last two columns on this machine.

Candidates: zlib.crc32 (block file format version 1), crc32c.crc32c
(version 2) and google_crc32c.value when importable (not a dependency:
``pip install --target DIR google-crc32c`` and put DIR on PYTHONPATH).
google_crc32c takes ``bytes`` only (no memoryview, mmap or bytearray), so
the tier would first copy each block out of its row, and it releases the
GIL only from 1 MiB up; it is timed on ``bytes`` copies made beforehand,
the copies not counted.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version

import crc32c

from tools.benchmark.lib.floors import best_of
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

# A block of the default model (23,040 B of KV a token) and of Qwen3-0.6B
# (114,688 B) at the block size vllm-uma serves.
DEFAULT_SIZES = (DEFAULT_BLOCK_TOKENS * 23_040, DEFAULT_BLOCK_TOKENS * 114_688)
CALLS_PER_THREAD = 4
COLD_SET_BYTES = 256 << 20
GIL_PROBE_CALLS = 100


@dataclass(frozen=True)
class Candidate:
    name: str
    fn: Callable[[object], int]
    # What the checksum is given for a block: the row itself, or a copy.
    prepare: Callable[[memoryview], object] = lambda data: data


def candidates() -> list[Candidate]:
    found = [
        Candidate("zlib.crc32", zlib.crc32),
        Candidate("crc32c.crc32c", crc32c.crc32c),
        Candidate("crc32c, GIL held", lambda data: crc32c.crc32c(data, gil_release_mode=0)),
    ]
    try:
        import google_crc32c
    except ImportError:
        return found
    if google_crc32c.implementation == "c":  # its pure-Python fallback is no candidate
        found.append(Candidate("google_crc32c.value", google_crc32c.value, bytes))
    return found


def page_aligned_random(nbytes: int) -> memoryview:
    """Random bytes in an anonymous mapping: aligned and writable like a
    primary-tier row, and not compressible. Random 1 MiB repeated: the
    checksum's speed does not depend on the bytes."""
    region = mmap.mmap(-1, nbytes)
    chunk = os.urandom(1 << 20)
    for start in range(0, nbytes, len(chunk)):
        region[start : start + len(chunk)] = chunk[: nbytes - start]
    return memoryview(region)


def hot_gbps(fn: Callable[[object], int], data, nbytes: int, repeats: int) -> float:
    return nbytes / best_of(repeats, lambda: fn(data)) / 1e9


def cold_gbps(fn: Callable[[object], int], blocks: list, nbytes: int, repeats: int) -> float:
    def each_once() -> None:
        for block in blocks:
            fn(block)

    return len(blocks) * nbytes / best_of(repeats, each_once) / 1e9


def two_threads_gbps(fn: Callable[[object], int], buffers: list, nbytes: int, repeats: int):
    """Two threads, each on its own buffer (as two I/O threads are on two
    blocks), started together by a barrier."""
    barrier = threading.Barrier(len(buffers) + 1)

    def work(buffer) -> None:
        barrier.wait()
        for _ in range(CALLS_PER_THREAD):
            fn(buffer)

    best = float("inf")
    for _ in range(repeats):
        threads = [threading.Thread(target=work, args=(b,)) for b in buffers]
        for thread in threads:
            thread.start()
        barrier.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        best = min(best, time.perf_counter() - start)
    return len(buffers) * CALLS_PER_THREAD * nbytes / best / 1e9


def calls_before_other_thread_ran(fn: Callable[[object], int], data, repeats: int) -> int:
    """How many of GIL_PROBE_CALLS back-to-back calls had begun on one thread
    when another thread, whose 1 ms sleep ended meanwhile, ran again: the
    most of ``repeats`` tries. With a switch interval of an hour no thread
    is made to give the GIL up, so the other thread runs again only once a
    call releases it: all of them if none does. Exact whatever the load."""
    begun: list[int] = []

    def work() -> None:
        for i in range(GIL_PROBE_CALLS):
            begun.append(i)
            fn(data)

    worst = 0
    interval = sys.getswitchinterval()
    sys.setswitchinterval(3600)
    try:
        for _ in range(repeats):
            begun.clear()
            thread = threading.Thread(target=work)
            thread.start()
            time.sleep(0.001)
            worst = max(worst, len(begun))
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"crc32c {version('crc32c')}, hardware_based={crc32c.hardware_based}")
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}, best of {args.repeats}")
    for size in args.sizes:
        region = page_aligned_random(COLD_SET_BYTES // size * size)
        blocks = [region[start : start + size] for start in range(0, region.nbytes, size)]
        print(f"\nbuffer {size:,} B")
        print(
            f"{'checksum':20} {'hot GB/s':>8} {'us/block':>8} {'cold GB/s':>9} "
            f"{'2 threads GB/s':>14} {'GIL: calls':>10}"
        )
        for c in candidates():
            given = [c.prepare(block) for block in blocks]
            hot = hot_gbps(c.fn, given[0], size, args.repeats)
            cold = cold_gbps(c.fn, given, size, min(args.repeats, 3))
            two = two_threads_gbps(c.fn, given[:2], size, args.repeats)
            calls = calls_before_other_thread_ran(c.fn, given[0], 3)
            gil = "held" if calls == GIL_PROBE_CALLS else "released"
            print(
                f"{c.name:20} {hot:8.2f} {size / hot / 1e3:8.0f} {cold:9.2f} "
                f"{two:14.2f} {calls:5} {gil}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
