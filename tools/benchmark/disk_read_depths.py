"""How fast this disk reads with O_DIRECT at several queue depths and request sizes.

    .venv/bin/python -m tools.benchmark.disk_read_depths [--dir DIR] [--gib 2]

What the disk tier's read rate is bounded by, independent of the tier:
one file of ``--gib`` GiB (random bytes, written once in ``--dir``, the
project's disk by default, and removed at the end) is read whole, page
cache dropped before each read, by N threads each issuing requests of one
size (``os.preadv`` into its own page-aligned buffer, O_DIRECT). The tier
itself reads one block file per request on 8 threads
(disk_tier_bandwidth.py); if no depth here reads much faster than that,
a restore from disk cannot either, whatever the restore path does.
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.benchmark.lib.floors import drop_page_cache
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

REPO = Path(__file__).resolve().parents[2]
WRITE_CHUNK = 64 << 20
# A Qwen3-0.6B block file's KV (114,688 B a token) at vllm-uma's block size
# (32 tokens: 3.5 MiB), and at vLLM CPU's 128 (14 MiB).
TIER_REQUEST = DEFAULT_BLOCK_TOKENS * 114_688
# (threads, request bytes): the tier's own shape first, then the same at
# 128-token blocks, then a deeper queue of smaller requests.
SHAPES = (
    (4, TIER_REQUEST), (8, TIER_REQUEST), (16, TIER_REQUEST),
    (8, 14 << 20), (16, 14 << 20), (32, 1 << 20),
)  # fmt: skip


def write_file(path: Path, size: int) -> None:
    chunk = os.urandom(WRITE_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for _ in range(size // WRITE_CHUNK):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_rate(path: Path, size: int, threads: int, request: int) -> float:
    """GB/s of reading ``path`` whole with O_DIRECT, ``threads`` at once."""
    drop_page_cache(path)
    local = threading.local()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:

        def read(offset: int) -> None:
            if not hasattr(local, "buffer"):
                local.buffer = mmap.mmap(-1, request)  # page-aligned, as O_DIRECT needs
            os.preadv(fd, [local.buffer], offset)

        offsets = range(0, size - request + 1, request)
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, offsets))
        return len(offsets) * request / (time.perf_counter() - start) / 1e9
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=REPO, help="a directory on the disk to measure")
    ap.add_argument("--gib", type=float, default=2.0, help="size of the file read")
    args = ap.parse_args()
    size = int(args.gib * 2**30) // WRITE_CHUNK * WRITE_CHUNK
    if size <= 0:
        ap.error(f"--gib {args.gib}: at least {WRITE_CHUNK >> 20} MiB is needed")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="disk-read-depths-") as tmp:
        path = Path(tmp) / "data"
        write_file(path, size)
        print(f"file: {size / 2**30:.1f} GiB in {args.dir}, O_DIRECT, page cache dropped")
        for threads, request in SHAPES:
            rate = read_rate(path, size, threads, request)
            print(f"threads {threads:3d}  request {request / 2**20:4.1f} MiB  {rate:5.2f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
