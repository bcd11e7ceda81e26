"""L3 bandwidth: the disk tier's store and restore beside the disk's own read speed.

    .venv/bin/python -m tools.benchmark.disk_tier_bandwidth [--dir DIR] [--blocks N]
        [--block-size 32] [--threads 4] [--model zoo-qwen3-real] [--json out.json]

1. The disk, two ways: a file of --seq-gib GiB read back with O_DIRECT in
   1 MiB requests one at a time (the disk's sequential speed, for the
   record), and block files read the way the tier reads them (O_DIRECT, as
   many at a time as the restore's threads, page cache dropped:
   lib/floors.py: disk_tier_read_gbps), the reference a restore is held to.
2. The tier: --blocks blocks of the model's row (one block of
   --block-size tokens, vllm-uma's default 32 unless given, 128 to compare
   with vLLM CPU's; from the model's config; --model as in
   lib/model_choice.py) stored by the real DiskTier from an mmap'd primary
   tier in jobs of a 1,152-token prefix's blocks (36 of 32 tokens, 9 of
   128), then the page cache is dropped for every block file (sync +
   posix_fadvise DONTNEED on each), and a new DiskTier on the same root
   (a restart) restores them all, checksums verified.
By default the same bytes at every block size: 64,000 tokens of KV (2,000
blocks of 32, 500 of 128), a primary tier of 8,192 tokens' rows (180 MiB
of the default model's); smaller blocks mean more files for those bytes.
The ratio restore / read as the tier reads is the target (>= 90%); all figures come from
one run, since the machine is shared. Files go under --dir (default: a temp
directory beside the project, on its disk: never tmpfs, whose "disk" is RAM)
and are deleted at the end.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

from tools.benchmark.lib import model_choice
from tools.benchmark.lib.floors import disk_tier_read_gbps, drop_page_cache
from tools.benchmark.lib.geometry import add_block_size_argument, kv_row_bytes
from tools.benchmark.lib.report import write_json
from vllm_uma.kv_offload.disk.io_tasks import DEFAULT_IO_THREADS
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.disk.tier import DiskTier

REPO = Path(__file__).resolve().parents[2]
MiB, GiB = 1 << 20, 1 << 30
# In tokens, so that every block size moves the same bytes.
JOB_TOKENS = 1152  # a job: a 1,200-token prompt's full blocks at 128 (9; 36 of 32)
PRIMARY_TOKENS = 8192  # jobs reuse the primary's rows (180 MiB of the default model's)
DEFAULT_TOKENS = 64_000  # stored and restored: 500 blocks of 128, 2,000 of 32
NS = bytes.fromhex("be" * 16)


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype, *_ = line.split()
        if str(path).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


def write_sequential(path: Path, nbytes: int) -> float:
    """Write ``path`` with O_DIRECT, 1 MiB at a time; bytes/s."""
    buf = mmap.mmap(-1, MiB)  # page aligned, as O_DIRECT needs
    buf[:] = os.urandom(MiB)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
    start = time.perf_counter()
    for _ in range(nbytes // MiB):
        os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)
    return nbytes / (time.perf_counter() - start)


def read_sequential(path: Path) -> float:
    """Read ``path`` with O_DIRECT (no page cache), 1 MiB at a time; bytes/s."""
    buf = mmap.mmap(-1, MiB)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    start = time.perf_counter()
    nbytes = 0
    while n := os.readv(fd, [buf]):
        nbytes += n
    seconds = time.perf_counter() - start
    os.close(fd)
    return nbytes / seconds


def make_tier(root: Path, view: memoryview, threads: int) -> DiskTier:
    config = DiskTierSettings(root, None, False, "benchmark: no cap")
    return DiskTier(
        SimpleNamespace(),
        view,
        "fs",
        settings=config,
        namespace_id=NS,
        namespace_info={"benchmark": "disk_tier_bandwidth"},
        io_threads=threads,
    )


def run_jobs(tier: DiskTier, blocks: int, load: bool, job_blocks: int, rows_n: int) -> float:
    """Submit every job (of ``job_blocks`` blocks, on a primary of
    ``rows_n`` rows) at once, poll like the scheduler does; seconds taken."""
    ctx = ReqContext(req_id="bench")
    submit = tier.submit_load if load else tier.submit_store
    start = time.perf_counter()
    pending = set()
    for job_id, first in enumerate(range(0, blocks, job_blocks)):
        ids = range(first, min(first + job_blocks, blocks))
        keys = [i.to_bytes(32, "big") + bytes(4) for i in ids]
        rows = np.array([i % rows_n for i in ids], dtype=np.int64)
        submit(TransferJob(job_id, keys, rows, load, ctx))
        pending.add(job_id)
    failed = 0
    while pending:
        for result in tier.get_finished_jobs():
            pending.discard(result.job_id)
            failed += not result.success
        time.sleep(0.0005)
    elapsed = time.perf_counter() - start
    if failed:
        raise SystemExit(f"{failed} {'load' if load else 'store'} jobs failed")
    return elapsed


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# The restore against a read the way the tier reads: block files, O_DIRECT,
# as many at a time as the tier's I/O threads, page cache dropped.
TARGET = 0.9


def restore(
    work: Path, view: memoryview, n: int, blocks: int, sequential: Path, job: int, label=""
):
    row = view.shape[1]  # one block of the model's KV
    sequential_Bps = read_sequential(sequential)
    disk = disk_tier_read_gbps(work, row, min(blocks * row, GiB), threads=n) * 1e9
    # Every block file, so the restore reads the disk, not the page cache.
    dropped = drop_page_cache(work / "tier")
    start = time.perf_counter()
    tier = make_tier(work / "tier", view, n)  # a restart: the index comes from a scan
    scan = time.perf_counter() - start
    cpu = cpu_seconds()
    took = run_jobs(tier, blocks, True, job, view.shape[0])
    cpu = cpu_seconds() - cpu
    tier.shutdown()
    nbytes = blocks * row
    floor = nbytes / disk
    run = {
        "threads": n,
        "disk_read_Bps": disk,
        "disk_sequential_qd1_Bps": sequential_Bps,
        "restore_Bps": nbytes / took,
        "restore_s": took,
        "floor_s": floor,
        "ratio": floor / took,
        "scan_s": scan,
        "loadavg_1m": os.getloadavg()[0],
        "cpu_us_per_block": cpu / blocks * 1e6,
    }
    print(
        f"{label or f'{n:2d} threads'}: disk as the tier reads {disk / 1e9:.2f} GB/s "
        f"(sequential QD1 {sequential_Bps / 1e9:.2f}; reference {floor:.2f} s); "
        f"restore {nbytes / took / 1e9:.2f} GB/s ({took:.2f} s, "
        f"{dropped / 2**20:.0f} MiB uncached) = "
        f"{floor / took:.0%}; CPU {run['cpu_us_per_block']:.0f} us/block; "
        f"scan {scan * 1e3:.0f} ms; load {run['loadavg_1m']:.1f}"
    )
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="where the temp files go")
    add_block_size_argument(ap)
    ap.add_argument(
        "--blocks",
        type=int,
        default=None,
        help=f"blocks stored and restored (default: {DEFAULT_TOKENS:,} tokens' worth)",
    )
    ap.add_argument("--seq-gib", type=float, default=3.0, help="size of the sequential file")
    ap.add_argument("--threads", default=str(DEFAULT_IO_THREADS), help="I/O threads, e.g. 1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3, help="restores per thread count")
    ap.add_argument("--json", type=Path, default=None)
    model_choice.add_argument(ap)
    args = ap.parse_args()
    parent = (args.dir or REPO).resolve()
    kind = fs_type(parent)
    if kind in ("tmpfs", "ramfs"):
        raise SystemExit(f"--dir {parent} is on {kind}, i.e. RAM: choose a directory on disk")
    work = Path(tempfile.mkdtemp(prefix=".disk-tier-bench-", dir=parent))
    try:
        report = measure(work, args, kind)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        write_json(args.json, report)
    return 0


def measure(work: Path, args, kind: str) -> dict:
    choice = model_choice.choose(args.model)
    block = args.block_size
    row = kv_row_bytes(choice.directory, block_tokens=block)
    args.blocks = args.blocks or DEFAULT_TOKENS // block
    job, rows_n = max(1, JOB_TOKENS // block), max(1, PRIMARY_TOKENS // block)
    nbytes = args.blocks * row
    print(f"model {choice.describe()}")
    print(
        f"dir {work} ({kind}); {args.blocks} blocks of {block} tokens, {row:,} B = "
        f"{nbytes / GiB:.2f} GiB; jobs of {job} blocks"
    )
    sequential = work / "sequential.bin"
    seq_write = write_sequential(sequential, int(args.seq_gib * GiB))
    primary = mmap.mmap(-1, rows_n * row)
    view = memoryview(primary).cast("B", (rows_n, row))
    primary[:] = np.random.default_rng(0).bytes(len(primary))
    threads = [int(t) for t in args.threads.split(",")]
    tier = make_tier(work / "tier", view, threads[0])
    stored = run_jobs(tier, args.blocks, False, job, rows_n)
    tier.shutdown()
    io = "O_DIRECT" if tier._store.direct else "buffered"
    print(f"disk, O_DIRECT 1 MiB sequential write: {seq_write / 1e9:.2f} GB/s")
    print(f"store: {nbytes / stored / 1e9:.2f} GB/s ({stored:.2f} s, {threads[0]} threads, {io})")
    report: dict = {
        "dir": str(work),
        "fs": kind,
        "blocks": args.blocks,
        "block_tokens": block,
        "job_blocks": job,
        "model": choice.describe(),
        "row_bytes": row,
        "disk_seq_write_Bps": seq_write,
        "store_Bps": nbytes / stored,
        "runs": [],
    }
    print(f"restores of {args.blocks} block files after dropping them from the page cache:")
    # Each restore is paired with a read of the disk just before it, and the
    # thread counts take turns: the machine (and its virtual disk) is shared,
    # so a ratio must compare like with like. The first pair only warms up:
    # it competes with the write-back of everything just written.
    restore(work, view, threads[0], args.blocks, sequential, job, label="warm-up")
    for _ in range(args.repeats):
        for n in threads:
            report["runs"].append(restore(work, view, n, args.blocks, sequential, job))
    print("median per thread count:")
    for n in threads:
        runs = [r for r in report["runs"] if r["threads"] == n]
        ratio = statistics.median(r["ratio"] for r in runs)
        bps = statistics.median(r["restore_Bps"] for r in runs)
        disk = statistics.median(r["disk_read_Bps"] for r in runs)
        verdict = "met" if ratio >= TARGET else "NOT met"
        report.setdefault("median", {})[n] = {"ratio": ratio, "restore_Bps": bps}
        print(
            f"{n:2d} threads: restore {bps / 1e9:.2f} GB/s, disk {disk / 1e9:.2f} GB/s, "
            f"ratio {ratio:.0%} (target >= {TARGET:.0%}: {verdict})"
        )
    view.release()
    primary.close()
    return report


if __name__ == "__main__":
    raise SystemExit(main())
