"""What KV offloading gains on this machine: four workloads, offloading off and on.

    .venv/bin/python -m tools.benchmark.kv_offload_benchmark --out bench-out/kv_offload.json

Workloads (prompts of --prompt-tokens, greedy, --concurrency in flight):
  no_reuse       distinct prompts (control: nothing to restore)
  reuse_fits     shared prefixes that fit L1, distinct suffixes (control)
  spill_revisit  prefixes overflowing L1, served once, then the revisits are measured
  restart        the spill traffic on a fresh process; only the disk tier can help
Each server serves --passes measured passes (restart: one): new prompts of
the same shape for the controls, the same revisits for spill_revisit.
Variants, a fresh server each, all with the same KV budget (--l1-bytes +
the pool, given with --kv-cache-memory-bytes): off has all of it as L1; pool
has the host pool (--kv-offloading-size) and the rest; pool_disk has the fs
disk tier and the pool the server sizes itself (the disk tier's staging
area) and the rest. So the comparison is what the tiers win on the same RAM.
--more-memory gives the older one: --l1-bytes of L1 for all, the pool on top.
The spill set is sized from --l1-bytes (the server's own max_tokens_cached,
scaled), so it leaves --l1-bytes of L1 but may fit a bigger one. Writes
the JSON, a PNG beside it, and the server logs in <out>-logs/. Exit status
1 if a variant failed (e.g. a server refused its flags).

The servers run vllm-uma's default block (32 tokens, plugin/block_size.py)
unless --server-args gives --block-size; the rows of the disk reference
and the defaults below are computed at that block size. L1 and the pool
default to the same bytes at every block size (17,344 and 46,592 tokens
of the model's KV: 542 and 1,456 blocks of 32 tokens, 135.5 and 364 of
128; 399,605,760 B and 1 GiB for the default model), so a run at 32 and
one at 128 serve the same workload in the same memory.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from tools.benchmark.kv_offload_report import VARIANTS, busy, chart, compare, expectations, table
from tools.benchmark.kv_offload_rounds import machine_probe, merge_rounds, probe_change, rotate
from tools.benchmark.kv_offload_runner import Runner
from tools.benchmark.kv_offload_workloads import MAX_CONTROL_REQUESTS, WORKLOADS, Settings
from tools.benchmark.lib import model_choice, servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.floors import disk_tier_read_gbps, memcpy_gbps
from tools.benchmark.lib.geometry import kv_row_bytes
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.report import GiB, missing_chart_library, write_json
from vllm_uma import models
from vllm_uma.kv_offload.disk.io_tasks import DEFAULT_IO_THREADS
from vllm_uma.kv_offload.pool_size import staging_tokens

PROBE_PAUSE_S = 5.0


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    _add_run_flags(ap)
    _add_traffic_flags(ap)
    _add_memory_and_disk_flags(ap)
    args = ap.parse_args(argv)
    for key, known in (("workloads", WORKLOADS), ("variants", VARIANTS)):
        chosen = [x for x in getattr(args, key).split(",") if x]
        bad = sorted(set(chosen) - set(known))
        if bad or not chosen:
            ap.error(f"--{key} {getattr(args, key)!r}: choose from {', '.join(known)}")
        setattr(args, key, [x for x in known if x in chosen])
    args.model = model_choice.served_model(ap, args.model)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1 (3 or more give a range)")
    if not 1 <= args.passes or args.passes * args.requests > MAX_CONTROL_REQUESTS:
        ap.error(
            f"--passes {args.passes} x --requests {args.requests}: at least 1 pass, at most "
            f"{MAX_CONTROL_REQUESTS} requests in all (each workload's prompts have their own "
            f"seeds); lower --passes or --requests"
        )
    if args.prompt_tokens + args.max_tokens > args.max_model_len:
        ap.error("--prompt-tokens + --max-tokens must fit in --max-model-len")
    args.disk_dir = (args.disk_dir or args.out.parent).absolute()
    # L1 and the pool default to as many tokens of KV as the default model's
    # 400 MB and 1 GiB hold, in the chosen model's bytes: a model with five
    # times the KV per token gets five times the bytes, the same workload;
    # in tokens, not blocks, so that every block size gets the same bytes.
    zoo = Path(args.model)
    block = args.block_tokens = servers.block_tokens(shlex.split(args.server_args))
    directory = zoo if zoo.is_dir() else models.prepare(args.model)
    row = args.row_bytes = kv_row_bytes(directory, block_tokens=block)
    per_token = row // block  # of one KV cache group's layers, as a row holds
    if args.l1_bytes is None:
        args.l1_bytes = DEFAULT_L1_TOKENS * per_token
    if args.pool_gib is None:
        args.pool_gib = round(DEFAULT_POOL_TOKENS * per_token / GiB, 2)
    args.equal_memory = not args.more_memory
    # The pool pool_disk's server sizes itself at equal memory (pool_size.py):
    # its L1 is the budget less this. The breakdown line is checked against it.
    args.staging_bytes = staging_tokens(args.max_model_len, batch_tokens(args.server_args)) * (
        per_token
    )
    if args.disk_cap_gib is None:
        # The spill set fits the pool by construction; twice the pool leaves
        # room for the controls' stores too.
        args.disk_cap_gib = 2 * args.pool_gib
    return args


# vLLM CPU's API server: 2048 tokens a step unless the server's flags say otherwise.
CPU_BATCH_TOKENS = 2048


def batch_tokens(server_args: str) -> int:
    """--max-num-batched-tokens among the extra server flags, else vLLM CPU's."""
    words = shlex.split(server_args)
    for i, word in enumerate(words):
        if word.startswith("--max-num-batched-tokens="):
            return int(word.split("=", 1)[1])
        if word == "--max-num-batched-tokens" and i + 1 < len(words):
            return int(words[i + 1])
    return CPU_BATCH_TOKENS


# The defaults' sizes in tokens of KV: what 400 MB and 1 GiB held of the
# default model's 2,949,120-byte blocks of 128 tokens (135 and a half, and
# 364), the same bytes at every block size. The half block was slack that
# kept the server's floor division at 135 blocks; at 32 tokens it is two
# whole blocks (542 in all).
DEFAULT_L1_TOKENS = 17_344  # 135.5 x 128
DEFAULT_POOL_TOKENS = 46_592  # 364 x 128


def _add_run_flags(ap: argparse.ArgumentParser) -> None:
    """Where the results go, and what is run how often."""
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out/kv_offload_benchmark.json"),
        help="the JSON; the PNG and <stem>-logs/ go beside it",
    )
    ap.add_argument(
        "--model",
        default=models.DEFAULT_MODEL_NAME,
        help=f"the model every server serves, by recipe name ({', '.join(models.RECIPES)}) "
        "or model zoo build (zoo-qwen3-real, ...: synthetic weights); prepared first if needed",
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds per workload; each runs every variant once, in a rotated order",
    )


def _add_traffic_flags(ap: argparse.ArgumentParser) -> None:
    """The requests of every workload."""
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    ap.add_argument("--prompt-tokens", type=int, default=4000, help="tokens per prompt")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    ap.add_argument("--requests", type=int, default=8, help="measured requests of the controls")
    ap.add_argument(
        "--passes",
        type=int,
        default=3,
        help="measured passes of --requests per server (no_reuse, reuse_fits, spill_revisit; "
        "restart has one): with requests in flight, how the idle engine's first step "
        "batches them is a race that moves one pass's p50 by a third",
    )
    ap.add_argument("--suffix-tokens", type=int, default=256, help="reuse_fits: distinct suffix")


def _add_memory_and_disk_flags(ap: argparse.ArgumentParser) -> None:
    """Each server's L1 and pool, the disk tier and its probe, extra flags."""
    ap.add_argument(
        "--l1-bytes",
        type=int,
        default=None,
        help="--kv-cache-memory-bytes of every server: L1 (default: 17,344 tokens of the "
        "model's KV, 542 blocks of 32 tokens: 400 MB for the default model)",
    )
    ap.add_argument(
        "--pool-gib",
        type=float,
        default=None,
        help="--kv-offloading-size (default: 46,592 tokens of the model's KV, 1,456 blocks "
        "of 32 tokens: 1 GiB for the default model)",
    )
    ap.add_argument("--spill-factor", type=float, default=2.0, help="spill set / L1 tokens")
    ap.add_argument("--max-model-len", type=int, default=8192, help="of every server")
    ap.add_argument(
        "--more-memory",
        action="store_true",
        help="the older comparison: every variant has --l1-bytes of L1 and the pool variants "
        "their pool on top (offloading with more memory against off). By default all "
        "variants share one budget, --l1-bytes + the pool: off has it all as L1, pool its "
        "pool and the rest, pool_disk the server's own staging pool and the rest",
    )
    ap.add_argument(
        "--disk-dir", type=Path, help="disk tier and read probe volume (default: --out's dir)"
    )
    ap.add_argument("--disk-cap-gib", type=float, help="fs tier max_size_gib (default 2 x pool)")
    ap.add_argument("--keep-disk", action="store_true", help="keep the disk tiers' directories")
    ap.add_argument("--probe-mib", type=int, default=1024, help="size of the bandwidth probes")
    ap.add_argument(
        "--server-args",
        default="",
        help="extra `vllm-uma serve` flags, one string; a --block-size here sets the block "
        "the rows are computed at (default: vllm-uma's, 32 tokens)",
    )


def check_disk_space(args: argparse.Namespace) -> str | None:
    """Why pool_disk cannot run here, or None. One disk tier exists at a time
    (each is removed after its variant), beside the read probe."""
    need = args.disk_cap_gib * GiB + args.probe_mib * 2**20 + GiB
    free = shutil.disk_usage(args.disk_dir).free
    if "pool_disk" in args.variants and free < need:
        return (
            f"pool_disk needs {need / GiB:.1f} GiB free on {args.disk_dir} (disk cap "
            f"{args.disk_cap_gib} GiB + probe + 1 GiB), only {free / GiB:.1f} GiB is free: "
            f"pass --disk-dir on another volume, lower --disk-cap-gib, or drop pool_disk "
            f"from --variants"
        )
    if args.probe_mib * 2**20 + GiB > free:
        return f"no room for the {args.probe_mib} MiB disk probe on {args.disk_dir}"
    return None


def measure_bandwidth(args: argparse.Namespace) -> dict:
    progress(f"measuring memory copy and disk read bandwidth ({args.probe_mib} MiB each)")
    nbytes = args.probe_mib * 2**20
    # The disk reference reads as the tier does: one KV block per file
    # (the row from the model's config; the runner checks it against the
    # servers' breakdown line), O_DIRECT, on the tier's I/O threads.
    row = args.row_bytes
    bw = {
        "memcpy_gbps": round(memcpy_gbps(nbytes, repeats=3), 2),
        "disk_read_gbps": round(
            disk_tier_read_gbps(args.disk_dir, row, nbytes, DEFAULT_IO_THREADS), 2
        ),
        "disk_read": f"block files of {row} B, O_DIRECT, {DEFAULT_IO_THREADS} threads",
        "row_bytes": row,
        "probe_bytes": nbytes,
        "disk_dir": str(args.disk_dir),
    }
    progress(f"memcpy {bw['memcpy_gbps']} GB/s, disk read {bw['disk_read_gbps']} GB/s")
    return bw


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    if problem := missing_chart_library("kv_offload_benchmark", "make bench"):
        print(problem, file=sys.stderr)
        return 2
    if problem := check_disk_space(args):
        print(f"kv_offload_benchmark: {problem}", file=sys.stderr)
        return 2
    env = environment(args)
    bandwidth = measure_bandwidth(args)
    log_dir = args.out.with_name(args.out.stem + "-logs")
    log_dir.mkdir(exist_ok=True)
    runner = Runner(Settings.from_args(args), bandwidth, log_dir)
    workloads = {name: run_rounds(runner, name, args) for name in args.workloads}
    reasons = compare(workloads, args.equal_memory)
    warnings = expectations(workloads, args.equal_memory) + runner.warnings
    warnings += busy(workloads, env["loadavg_before"][0], os.cpu_count() or 1)
    failed = [f"{w}/{v}" for w, vs in workloads.items() for v, fig in vs.items() if "error" in fig]
    report = {
        "suspect": bool(reasons),
        "suspect_reasons": reasons,
        "warnings": warnings,
        "failed": failed,
        "environment": {**env, "loadavg_after": list(os.getloadavg())},
        "bandwidth": bandwidth,
        "sizing": runner.sizing_report(),
        "workloads": workloads,
    }
    write_json(args.out, report)
    print(table(workloads))
    png = args.out.with_suffix(".png")
    title = _title(env, args) + ("\nSUSPECT: " + reasons[0][:110] if reasons else "")
    chart(workloads, png, title)
    bw = bandwidth
    print(f"floors: memcpy {bw['memcpy_gbps']} GB/s, disk read {bw['disk_read_gbps']} GB/s")
    print(f"suspect: {str(report['suspect']).lower()}" + "".join(f"\n  - {r}" for r in reasons))
    for w in warnings:
        print(f"warning: {w}")
    for f in failed:
        print(f"FAILED {f}: {workloads[f.split('/')[0]][f.split('/')[1]]['error'].splitlines()[0]}")
    print(f"wrote {args.out}, {png}, logs in {log_dir}")
    return 1 if failed else 0


def run_rounds(runner: Runner, workload: str, args: argparse.Namespace) -> dict[str, dict]:
    """Every variant once per round, in rotated order, a machine probe around
    each run (kv_offload_rounds.py); the rounds merged per variant."""
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    for r in range(args.repeats):
        order = rotate(list(args.variants), r)
        for position, variant in enumerate(order):
            progress(f"{workload}: round {r + 1} of {args.repeats}, {variant}")
            # A server's exit frees gigabytes for a few seconds; a probe taken
            # then reads 30-80% slow (seen: memcpy 9.7 vs 14.7 GB/s; the loop
            # 0.09 s right after every run vs 0.05 s before it).
            time.sleep(PROBE_PAUSE_S)
            before = machine_probe()
            fig = runner.run(workload, variant)
            time.sleep(PROBE_PAUSE_S)  # the run's own server has just exited too
            after = machine_probe()
            fig["probe"] = {"before": before, "after": after}
            fig["order"] = position
            if noisy := probe_change(before, after):
                fig["noisy"] = noisy
                progress(f"{workload}/{variant} round {r + 1}: noisy ({noisy})")
            runs[variant].append(fig)
    return {v: merge_rounds(runs[v]) for v in args.variants}


def _title(env: dict, args: argparse.Namespace) -> str:
    return (
        f"{args.model}; vllm-uma {env['versions']['vllm-uma']}, vllm {env['versions']['vllm']}, "
        f"{env['cpu_count']} cores; {args.repeats} rounds; {args.prompt_tokens}-token prompts, "
        f"concurrency "
        f"{args.concurrency}, "
        + (
            f"equal memory: {(args.l1_bytes + args.pool_gib * GiB) / 1e6:.0f} MB of KV each "
            f"(pool {args.pool_gib} GiB, pool_disk's staging pool "
            f"{args.staging_bytes / 1e6:.0f} MB)"
            if args.equal_memory
            else f"L1 {args.l1_bytes / 1e6:.0f} MB, pool {args.pool_gib} GiB on top"
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
