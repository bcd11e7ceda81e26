"""TTFT of a prefix restored from the host pool (L2) or the disk tier (L3),
against an L1 hit and a recompute.

    .venv/bin/python -m tools.benchmark.kv_offload_ttft [--prompt-tokens 4000] [--rounds 3]
        [--disk-dir DIR]

One server with a 2 GiB pool and an L1 of about two prompts
(--kv-cache-memory-bytes). Each round: prompt P cold (recompute), P again
(L1 hit), three other prompts (P leaves L1), P again (restored from L2).
A second pair of servers, pool off and on, serves distinct prompts at
concurrency 4 to show what offloading costs when nothing is reused.
Then the restart: a server with the disk tier serves ``--rounds`` prompts
cold and stops; the block files are dropped from the page cache; a new
server on the same directory serves them again (restored from L3).
Requests use max_tokens=1, so latency is the TTFT. Medians of one run;
ratios are what to compare on a shared machine. The floor for a restore is
its bytes (per token, from the server's breakdown line) over the bandwidth
measured here: memory copy for L2; for L3 a reference, the disk read the
way the tier reads (block files, O_DIRECT, as many threads), page cache
dropped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.benchmark.lib import servers
from tools.benchmark.lib.floors import disk_tier_read_gbps, drop_page_cache, memcpy_gbps
from tools.benchmark.lib.prompts import MODEL, text
from tools.benchmark.lib.report import Column, Table
from tools.benchmark.lib.servers import disk_tier_args
from vllm_uma.kv_offload.disk.io_tasks import DEFAULT_IO_THREADS
from vllm_uma.server_process import Server

COMMON = ["--max-model-len", "8192", "--kv-cache-memory-bytes", str(220 * 10**6)]


def ttft(server, prompt: str) -> float:
    start = time.perf_counter()
    server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    return time.perf_counter() - start


def start(args: list[str], log_dir: Path, name: str) -> Server:
    print(f"starting {name} ...", file=sys.stderr, flush=True)
    return servers.start(COMMON + args, log_dir / f"{name}.log")


def kv_geometry(server: Server) -> tuple[int, int]:
    """(KV bytes per token, bytes per block) as the server reports them."""
    b = servers.breakdown(server)
    # Every KV cache group holds a block per block_size tokens of a prefix.
    per_token = b["per_block_bytes"] * b["kv_groups"] // b["block_size"]
    return per_token, b["per_block_bytes"]


def revisit_rounds(log_dir: Path, tokens: int, rounds: int) -> dict[str, list[float]]:
    times = {"recompute": [], "l1_hit": [], "l2_restore": []}
    server = start(["--kv-offloading-size", "2"], log_dir, "pool")
    try:
        for r in range(rounds):
            p = text(100 + r, tokens)
            times["recompute"].append(ttft(server, p))
            times["l1_hit"].append(ttft(server, p))
            for k in range(3):
                ttft(server, text(200 + 10 * r + k, tokens))
            times["l2_restore"].append(ttft(server, p))
            print(
                f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
                file=sys.stderr,
            )
    finally:
        server.stop()
    return times


def no_reuse_throughput(log_dir: Path, tokens: int, requests: int) -> dict[str, float]:
    out = {}
    for name, extra in (("off", []), ("pool", ["--kv-offloading-size", "2"])):
        server = start(extra, log_dir, f"noreuse-{name}")
        try:
            prompts = [text(1000 + i, tokens // 2) for i in range(requests)]
            begin = time.perf_counter()
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda p, s=server: ttft(s, p), prompts))
            out[name] = requests * (tokens // 2) / (time.perf_counter() - begin)
        finally:
            server.stop()
    return out


def disk_restart(log_dir: Path, disk_dir: Path, tokens: int, rounds: int) -> dict[str, list]:
    """Recompute on a first server, restore from disk on a second one."""
    times = {"recompute": [], "l3_restart": []}
    args = ["--kv-offloading-size", "2", *disk_tier_args(disk_dir, cap_gib=0)]
    prompts = [text(300 + r, tokens) for r in range(rounds)]
    first = start(args, log_dir, "disk-first")
    try:
        times["geometry"] = kv_geometry(first)
        times["recompute"] = [ttft(first, p) for p in prompts]
    finally:
        first.stop()  # a clean stop: every block file is written by now
    dropped = drop_page_cache(disk_dir)
    print(f"dropped {dropped / 2**20:.0f} MiB of block files from the page cache", file=sys.stderr)
    second = start(args, log_dir, "disk-restart")
    try:
        times["l3_restart"] = [ttft(second, p) for p in prompts]
    finally:
        second.stop()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-reuse-requests", type=int, default=12)
    ap.add_argument(
        "--disk-dir",
        type=Path,
        default=Path(__file__).resolve().parent / "bench-out",
        help="a directory on the disk to measure (not tmpfs); a temp dir is made in it",
    )
    args = ap.parse_args()
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="kv-offload-ttft-") as tmp,
        tempfile.TemporaryDirectory(prefix="kv-disk-tier-", dir=args.disk_dir) as disk_tmp,
    ):
        times = revisit_rounds(Path(tmp), args.prompt_tokens, args.rounds)
        tput = no_reuse_throughput(Path(tmp), args.prompt_tokens, args.no_reuse_requests)
        disk = disk_restart(Path(tmp), Path(disk_tmp) / "kv", args.prompt_tokens, args.rounds)
        per_token, per_block = disk.pop("geometry")
        disk_gbps = disk_tier_read_gbps(Path(disk_tmp), per_block, 1 << 30, DEFAULT_IO_THREADS)
    med = {k: statistics.median(v) for k, v in times.items()}
    restore_bytes = args.prompt_tokens * per_token
    floor = restore_bytes / (memcpy_gbps(restore_bytes) * 1e9)
    cases = Table([Column("case", 12, left=True), Column("median TTFT s", 14, "{:.3f}")])
    print(cases.header())
    for k, v in med.items():
        print(cases.row([k, v]))
    print(f"floor for restoring {restore_bytes / 2**20:.0f} MiB at memcpy speed: {floor:.3f} s")
    print(f"l2_restore / l1_hit = {med['l2_restore'] / med['l1_hit']:.2f} (target <= 1.5)")
    print(f"recompute / l2_restore = {med['recompute'] / med['l2_restore']:.1f} (target >= 10)")
    disk_med = {k: statistics.median(v) for k, v in disk.items()}
    disk_floor = restore_bytes / (disk_gbps * 1e9)
    print(
        f"restart from disk: recompute {disk_med['recompute']:.3f} s, restored "
        f"{disk_med['l3_restart']:.3f} s; reference: reading {restore_bytes / 2**20:.0f} MiB "
        f"at {disk_gbps:.2f} GB/s, the tier's way (block files, O_DIRECT, "
        f"{DEFAULT_IO_THREADS} threads, page cache dropped): {disk_floor:.3f} s"
    )
    print(
        f"recompute / l3_restart = {disk_med['recompute'] / disk_med['l3_restart']:.1f} "
        f"(target >= 5)"
    )
    cost = 1 - tput["pool"] / tput["off"]
    print(
        f"no reuse, concurrency 4: {tput['off']:.0f} tok/s off, {tput['pool']:.0f} tok/s with "
        f"the pool: cost {cost:.1%} (target <= 5%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
