"""What sharing one disk store costs: the ledger's time per store and lookup.

    .venv/bin/python -m tools.benchmark.disk_ledger_cost [--dir DIR]
        [--jobs 40] [--servers 1,3] [--block-size 32] [--json out.json]

For each count of servers in --servers, that many processes each build the
real DiskTier on one root_dir (under --dir: by default beside the project,
on its disk, never tmpfs) with a cap of a quarter of their traffic, and
store --jobs jobs of a 1,152-token prefix's blocks of the default model's
rows (blocks of --block-size tokens, vllm-uma's default 32 unless given:
36 blocks a job, or 9 of 128 to compare with vLLM CPU's; sized from its
config, so every block size stores the same bytes) through it: the real
I/O threads, the real ledger, evictions in every job once the cap is
reached. The ledger pays per block, the write per byte: at 32 tokens a
job has 4 times the ledger calls of 128 for the same bytes. The ledger's
own calls (reserve, commit) and the block file writes are timed where the
tier makes them, so the figures are the code's, at its parallelism. Then
each process times its lookups (what the scheduler thread pays per block:
a dict read and, on a hit, a queued touch) and its feed's flushes (touches
written, peers' changes read).

Printed per run: blocks stored per second (all servers), the ledger's CPU
time per store (reserve + commit, the unlink of its victims included) beside
the block write's, their ratio, the wall time of a store's ledger calls (p50,
and each call's p99: waits for the lock and the GIL show there), a lookup's
ns, a feed flush's ms, and whether the store is within the cap once every
server is gone (while they run, files being deleted are counted until
their unlink). One run: the ratios, not
the absolute times, are the result (the machine is shared).
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tools.benchmark.lib.geometry import add_block_size_argument, kv_bytes_per_token
from tools.benchmark.lib.report import Column, Table, at_rank, write_json

REPO = Path(__file__).resolve().parents[2]
# In tokens, so that every block size stores the same bytes.
JOB_TOKENS = 1152  # a job: 9 blocks of 128 tokens, 36 of 32
JOBS_IN_POOL = 4  # the pool's rows hold this many jobs' blocks


@dataclass(frozen=True)
class Geometry:
    """What a server's process stores: blocks of ``row`` bytes (one KV
    block of the default model in bf16), ``job_blocks`` a job."""

    row: int
    job_blocks: int

    @classmethod
    def of(cls, block_tokens: int, per_token: int) -> "Geometry":
        return cls(block_tokens * per_token, max(1, JOB_TOKENS // block_tokens))

    @property
    def rows(self) -> int:
        return JOBS_IN_POOL * self.job_blocks


def _timed(owner, name: str, into: list[float], cpu: list[float] | None = None) -> None:
    """Wrap ``owner.name`` to record its wall time (and this thread's CPU
    time: the call's own work, without waits for locks or the GIL)."""
    real = getattr(owner, name)

    def timed(*args, **kw):
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return real(*args, **kw)
        finally:
            into.append(time.perf_counter() - start)
            if cpu is not None:
                cpu.append(time.thread_time() - start_cpu)

    setattr(owner, name, timed)


def server(
    root: str, index: int, jobs: int, cap_bytes: int, geo: Geometry, out: multiprocessing.Queue
) -> None:
    """One server's process: stores ``jobs`` jobs through a real DiskTier on
    ``root``, then times its lookups; its figures go to ``out``."""
    from vllm.v1.kv_offload.base import ReqContext

    times = _time_the_tiers_calls()
    tier = _open_tier(Path(root), index, cap_bytes, geo)
    ctx = ReqContext(req_id=f"bench-{index}")
    keys, elapsed = _store_jobs(tier, ctx, index, jobs, geo.job_blocks)
    lookup_ns, hits = _time_lookups(tier, ctx, keys)
    used = tier.used_bytes
    tier.shutdown()
    out.put(
        dict(
            stores=len(times["write_s"]),
            **times,
            lookup_ns=lookup_ns,
            hits=hits,
            used=used,
            elapsed=elapsed,
        )
    )


def _time_the_tiers_calls() -> dict[str, list[float]]:
    """The ledger's calls, the block writes and the feed's flushes, timed
    where the tier makes them from now on in this process: name -> times."""
    from vllm_uma.kv_offload.disk import io_tasks
    from vllm_uma.kv_offload.disk.ledger import feed as ledger_feed
    from vllm_uma.kv_offload.disk.ledger.blocks import Ledger

    reserve_s: list[float] = []
    commit_s: list[float] = []
    ledger_cpu_s: list[float] = []
    write_s: list[float] = []
    write_cpu_s: list[float] = []
    flush_s: list[float] = []
    _timed(Ledger, "reserve", reserve_s, ledger_cpu_s)
    _timed(Ledger, "commit", commit_s, ledger_cpu_s)
    _timed(io_tasks, "write_block", write_s, write_cpu_s)
    _timed(ledger_feed.LedgerFeed, "flush", flush_s)
    return dict(
        reserve_s=reserve_s,
        commit_s=commit_s,
        write_s=write_s,
        ledger_cpu_s=ledger_cpu_s,
        write_cpu_s=write_cpu_s,
        flush_s=flush_s,
    )


def _open_tier(root: Path, index: int, cap_bytes: int, geo: Geometry):
    """The real DiskTier on ``root`` over a pool of ``geo.rows`` rows, each
    byte of them ``index + 1``."""
    from vllm_uma.kv_offload.disk.settings import DiskTierSettings
    from vllm_uma.kv_offload.disk.tier import DiskTier

    buffer = mmap.mmap(-1, geo.rows * geo.row)
    np.frombuffer(buffer, dtype=np.uint8)[:] = index + 1
    config = DiskTierSettings(root, cap_bytes, False, "benchmark")
    ns = bytes.fromhex("be" * 16)
    return DiskTier(
        SimpleNamespace(),
        memoryview(buffer).cast("B", (geo.rows, geo.row)),
        "fs",
        settings=config,
        namespace_id=ns,
        namespace_info={"model": "benchmark"},
    )


def _store_jobs(tier, ctx, index: int, jobs: int, job_blocks: int) -> tuple[list[bytes], float]:
    """``jobs`` store jobs of ``job_blocks`` blocks each, one at a time to
    its end; their keys and the seconds they took."""
    from vllm.v1.kv_offload.tiering.base import TransferJob

    keys = []
    start = time.perf_counter()
    for job_id in range(1, jobs + 1):
        job_keys = [
            (index * 10**9 + job_id * 10_000 + b).to_bytes(32, "big") + bytes(4)
            for b in range(job_blocks)
        ]
        rows = np.arange(job_blocks, dtype=np.int64) + (job_id % JOBS_IN_POOL) * job_blocks
        tier.submit_store(TransferJob(job_id, job_keys, rows, False, ctx))
        keys += job_keys
        tier.drain_jobs()
        list(tier.get_finished_jobs())
    return keys, time.perf_counter() - start


def _time_lookups(tier, ctx, keys: list[bytes], rounds: int = 20) -> tuple[float, int]:
    """A lookup's mean ns over ``rounds`` passes of ``keys``, and the hits of one pass."""
    from vllm.v1.kv_offload.base import LookupResult

    lookups = 0
    t0 = time.perf_counter_ns()
    for _ in range(rounds):
        for key in keys:
            lookups += tier.lookup(key, ctx) is LookupResult.HIT
    return (time.perf_counter_ns() - t0) / (rounds * len(keys)), lookups // rounds


def run(root: Path, servers: int, jobs: int, geo: Geometry) -> dict:
    traffic = servers * jobs * geo.job_blocks * (geo.row + 4096)
    cap = traffic // 4
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=server, args=(str(root), i, jobs, cap, geo, out)) for i in range(servers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    # The store at rest, every server gone: what the cap is about.
    from vllm_uma.kv_offload.disk.ledger.blocks import Ledger

    ledger = Ledger(root / ".noindex")
    used_at_rest = ledger.used_bytes()
    ledger.close()

    def pooled(name: str) -> list[float]:
        return sorted(x for r in results for x in r[name])

    reserve, commit, writes = pooled("reserve_s"), pooled("commit_s"), pooled("write_s")
    flushes = pooled("flush_s")
    per_store = statistics.median(reserve) + statistics.median(commit)
    stores = sum(r["stores"] for r in results)
    ledger_cpu = sum(x for r in results for x in r["ledger_cpu_s"]) / stores
    write_cpu = sum(x for r in results for x in r["write_cpu_s"]) / stores
    return dict(
        servers=servers,
        stores=stores,
        cap_bytes=cap,
        used_bytes_after=used_at_rest,
        blocks_per_s=stores / max(r["elapsed"] for r in results),
        ledger_cpu_per_store_us=ledger_cpu * 1e6,
        write_cpu_per_block_us=write_cpu * 1e6,
        ledger_cpu_over_write_cpu=ledger_cpu / write_cpu,
        ledger_per_store_p50_us=per_store * 1e6,
        reserve_p99_us=at_rank(reserve, 0.99) * 1e6,
        commit_p99_us=at_rank(commit, 0.99) * 1e6,
        write_per_block_p50_us=statistics.median(writes) * 1e6,
        ledger_over_write=per_store / statistics.median(writes),
        lookup_ns=statistics.mean(r["lookup_ns"] for r in results),
        feed_flush_p50_ms=statistics.median(flushes) * 1e3 if flushes else 0.0,
    )


# One row a run: the figures run() returns, in this order, then "cap held".
RUN_KEYS = (
    "servers", "stores", "blocks_per_s", "ledger_cpu_per_store_us", "write_cpu_per_block_us",
    "ledger_cpu_over_write_cpu", "ledger_per_store_p50_us", "reserve_p99_us", "commit_p99_us",
    "write_per_block_p50_us", "lookup_ns", "feed_flush_p50_ms",
)  # fmt: skip
RUNS = Table(
    [
        Column("servers", 7),
        Column("stores", 6),
        Column("blocks/s", 8, "{:.0f}"),
        Column("ledger CPU", 10, "{:.0f} us"),
        Column("write CPU", 10, "{:.0f} us"),
        Column("ratio", 6, "{:.1%}"),
        Column("wall p50", 9, "{:.2f} ms", unit=1e3),
        Column("reserve p99", 11, "{:.1f} ms", unit=1e3),
        Column("commit p99", 10, "{:.1f} ms", unit=1e3),
        Column("write p50", 9, "{:.2f} ms", unit=1e3),
        Column("lookup", 7, "{:.0f} ns"),
        Column("flush", 7, "{:.2f} ms"),
        Column("cap held", 0, left=True),
    ]
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=REPO)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--servers", default="1,3")
    add_block_size_argument(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    geo = Geometry.of(args.block_size, kv_bytes_per_token())
    print(
        f"blocks of {args.block_size} tokens, {geo.row:,} B (the default model's, bf16), "
        f"{geo.job_blocks} a job"
    )
    rows = []
    for count in [int(n) for n in args.servers.split(",")]:
        root = Path(tempfile.mkdtemp(prefix="uma-ledger-bench-", dir=args.dir))
        try:
            row = run(root / "kv", count, args.jobs, geo)
            rows.append({**row, "block_tokens": args.block_size})
        finally:
            shutil.rmtree(root)
    print("CPU: the thread's own time in the calls; wall: with the waits for the")
    print("write lock (other threads and servers) and the GIL (8 I/O threads, 2 cores).")
    print(RUNS.header())
    for r in rows:
        print(RUNS.row([r[key] for key in RUN_KEYS] + [r["used_bytes_after"] <= r["cap_bytes"]]))
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
