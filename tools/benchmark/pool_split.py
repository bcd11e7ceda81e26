"""At equal memory, how big should the host pool be? A sweep of the pool's share.

    .venv/bin/python -m tools.benchmark.pool_split --out bench-out/pool_split.json

On unified memory the KV cache (L1) and the host pool (L2) are the same RAM.
Every server here gets the same KV budget B (``--budget-blocks`` of the
model's KV blocks): ``off`` has all of it as L1; each sweep point
``pool_disk`` with a pool of N blocks has ``B - N`` blocks of L1, the pool
and the fs disk tier (``--tiers pool`` adds the same points without the
disk tier, where the pool is the last tier). The disk tier is where the pool's blocks go (vLLM's
tiering stores and restores through its primary tier), so the sweep asks
how small the pool can be before restores miss, and what a bigger one
costs L1.

Workloads, each on a fresh server per variant, sized from B in tokens:
  no_reuse   distinct prompts: every block is stored and nothing is restored
  fits       a working set of half of B, served twice; the second pass is measured
  equal      a working set of 0.9 B: all of it fits `off`'s L1, not a pool's
  larger     twice B: only the disk tier can serve the second pass
  restart    `larger`'s prompts on a fresh server after a writer stopped
             (`off` recomputes them; the disk's blocks leave the page cache)

Each prompt is ``--prompt-tokens`` long, ``--concurrency`` in flight, and a
working set is served in the same order twice, so LRU evicts a prompt
before it comes back whenever the set overflows a tier. Writes the JSON, a
PNG beside it (each variant's TTFT p50 over `off`'s, per workload) and the
server logs in <out>-logs/. Ratios are within this one run.

Blocks are the servers' own: vllm-uma's default (32 tokens,
plugin/block_size.py) unless --server-args gives --block-size, checked
against each server's breakdown line. The defaults are the same bytes at
every block size (tokens of KV, not blocks): a budget of 63,872 tokens
(1,996 blocks of 32, 499 of 128: 1.47 GB of the default model's KV) and
pools of 4,096, 12,288, 20,480 and 46,592 tokens (128, 384, 640 and 1,456
blocks of 32; 32, 96, 160 and 364 of 128). L1 gets half a block more than
its blocks, so the server's floor division lands on them: the only bytes
that differ with the block size (48 tokens' worth between 32 and 128).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path

from tools.benchmark.kv_offload_runner import Runner
from tools.benchmark.kv_offload_workloads import Settings, Traffic
from tools.benchmark.lib import model_choice, servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.geometry import kv_row_bytes
from tools.benchmark.lib.prompts import text
from tools.benchmark.lib.report import Column, GiB, Table, write_json
from vllm_uma import models

WORKLOADS = ("no_reuse", "fits", "equal", "larger", "restart")
# Working set over the budget B, in tokens (no_reuse: --requests prompts).
SHARE_OF_BUDGET = {"fits": 0.5, "equal": 0.9, "larger": 2.0, "restart": 2.0}
SEEDS = {"no_reuse": 11000, "fits": 12000, "equal": 13000, "larger": 14000, "restart": 14000}
# The budget's default, in tokens of KV so that every block size gets the
# same bytes: what the KV offloading benchmark gives L1 and the pool
# together (135 + 364 of the default model's blocks of 128 tokens).
DEFAULT_BUDGET_TOKENS = 499 * 128
DEFAULT_POOL_TOKENS = (32 * 128, 96 * 128, 160 * 128, 364 * 128)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out/pool_split.json"))
    ap.add_argument(
        "--model",
        default=models.DEFAULT_MODEL_NAME,
        help="a recipe or a model zoo build (zoo-qwen3-real: synthetic weights)",
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument(
        "--budget-blocks",
        type=int,
        default=None,
        help="every server's KV budget (L1 + pool) in the model's KV blocks of the servers' "
        f"block size (default: {DEFAULT_BUDGET_TOKENS:,} tokens' worth, 1,996 blocks of 32)",
    )
    ap.add_argument(
        "--pool-blocks",
        default=None,
        help="the sweep: pool sizes in KV blocks, comma-separated (default: "
        f"{', '.join(f'{t:,}' for t in DEFAULT_POOL_TOKENS)} tokens' worth)",
    )
    ap.add_argument(
        "--tiers",
        default="pool_disk",
        help="which offloading variants each sweep point runs: pool_disk, pool, or both",
    )
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--requests", type=int, default=8, help="no_reuse's prompts")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--disk-dir", type=Path, help="the disk tiers' volume (default: --out's dir)")
    ap.add_argument(
        "--server-args",
        default="",
        help="extra `vllm-uma serve` flags, one string; a --block-size here sets the block "
        "the sizes are counted in (default: vllm-uma's, 32 tokens)",
    )
    args = ap.parse_args(argv)
    block = args.block_tokens = servers.block_tokens(shlex.split(args.server_args))
    if args.budget_blocks is None:
        args.budget_blocks = DEFAULT_BUDGET_TOKENS // block
    if args.pool_blocks is None:
        args.pool_blocks = ",".join(str(t // block) for t in DEFAULT_POOL_TOKENS)
    chosen = [w for w in args.workloads.split(",") if w]
    if bad := sorted(set(chosen) - set(WORKLOADS)) or not chosen:
        ap.error(f"--workloads {args.workloads!r}: choose from {', '.join(WORKLOADS)} ({bad})")
    args.workloads = [w for w in WORKLOADS if w in chosen]
    tiers = [t for t in args.tiers.split(",") if t]
    if not tiers or set(tiers) - {"pool_disk", "pool"}:
        ap.error(f"--tiers {args.tiers!r}: pool_disk, pool or both, comma-separated")
    args.tiers = [t for t in ("pool_disk", "pool") if t in tiers]
    try:
        args.pool_blocks = sorted({int(x) for x in args.pool_blocks.split(",") if x})
    except ValueError:
        ap.error(f"--pool-blocks {args.pool_blocks!r}: whole numbers, comma-separated")
    if not args.pool_blocks or args.pool_blocks[0] < 1:
        ap.error(f"--pool-blocks {args.pool_blocks}: at least one size, each 1 block or more")
    if args.pool_blocks[-1] >= args.budget_blocks:
        ap.error(
            f"--pool-blocks {args.pool_blocks[-1]} leaves no L1 in a budget of "
            f"{args.budget_blocks} blocks: raise --budget-blocks or lower the pool"
        )
    args.model = model_choice.served_model(ap, args.model)
    args.disk_dir = (args.disk_dir or args.out.parent).absolute()
    zoo = Path(args.model)
    directory = zoo if zoo.is_dir() else models.prepare(args.model)
    args.row_bytes = kv_row_bytes(directory, block_tokens=block)
    return args


class SweepRunner(Runner):
    """The KV offloading benchmark's runner with this sweep's traffic."""

    def __init__(self, settings: Settings, log_dir: Path, traffic: dict[str, Traffic]):
        super().__init__(settings, {"memcpy_gbps": 1.0, "disk_read_gbps": 1.0}, log_dir)
        self.shared_traffic = traffic

    def traffic_for(self, workload: str) -> Traffic:
        return self.shared_traffic[workload]


def build_traffic(args: argparse.Namespace, budget_tokens: int) -> dict[str, Traffic]:
    out = {}
    for name in args.workloads:
        seed, t = SEEDS[name], args.prompt_tokens
        if name == "no_reuse":
            out[name] = Traffic((), tuple(text(seed + i, t) for i in range(args.requests)))
            continue
        n = max(args.concurrency, math.ceil(SHARE_OF_BUDGET[name] * budget_tokens / t))
        prompts = tuple(text(seed + i, t) for i in range(n))
        out[name] = Traffic(prompts, prompts)
    return out


def settings_for(args, pool_blocks: int) -> Settings:
    """A point's settings: L1 = B - pool, the pool, and `off` at B
    (equal_memory gives `off` the pool's bytes as L1)."""
    row = args.row_bytes
    l1_blocks = args.budget_blocks - pool_blocks
    working = max(SHARE_OF_BUDGET.values()) * args.budget_blocks * row
    return Settings(
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        requests=args.requests,
        suffix_tokens=0,
        l1_bytes=l1_blocks * row + row // 2,
        pool_gib=pool_blocks * row / GiB,
        spill_factor=0.0,
        max_model_len=args.max_model_len,
        equal_memory=True,
        disk_dir=args.disk_dir,
        # Room for the largest working set and the controls beside it.
        disk_cap_gib=round(1.5 * working / GiB + 0.5, 2),
        keep_disk=False,
        model=args.model,
        server_args=tuple(shlex.split(args.server_args)),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    env = environment(args)
    log_dir = args.out.with_name(args.out.stem + "-logs")
    log_dir.mkdir(exist_ok=True)
    block_tokens = args.block_tokens  # checked against each server's breakdown below
    budget_tokens = args.budget_blocks * block_tokens
    traffic = build_traffic(args, budget_tokens)
    runners = {"off": SweepRunner(settings_for(args, args.pool_blocks[0]), log_dir, traffic)}
    for tier in args.tiers:
        for n in args.pool_blocks:
            runners[f"{tier}_{n}"] = SweepRunner(settings_for(args, n), log_dir, traffic)
    results: dict[str, dict[str, dict]] = {}
    for w_index, workload in enumerate(args.workloads):
        names = list(runners)
        # Each workload starts with another variant: drift spreads over all.
        names = names[w_index % len(names) :] + names[: w_index % len(names)]
        results[workload] = {}
        for name in names:
            time.sleep(3)  # the previous server's memory goes back first
            results[workload][name] = run_one(runners[name], workload, name)
    for runner in runners.values():
        if runner.sizing and runner.sizing.block_size != block_tokens:
            print(
                f"pool_split: the model's block is {runner.sizing.block_size} tokens, "
                f"the traffic assumed {block_tokens}",
                file=sys.stderr,
            )
            return 1
    ratios(results)
    report = {
        "environment": {**env, "loadavg_after": list(os.getloadavg())},
        "budget_blocks": args.budget_blocks,
        "block_tokens": args.block_tokens,
        "row_bytes": args.row_bytes,
        "pool_blocks": args.pool_blocks,
        "prompts": {w: len(t.measured) for w, t in traffic.items()},
        "workloads": results,
    }
    write_json(args.out, report)
    print(table(results, args))
    chart(results, args, args.out.with_suffix(".png"), env)
    failed = [f"{w}/{v}" for w, vs in results.items() for v, fig in vs.items() if "error" in fig]
    for f in failed:
        print(f"FAILED {f}")
    print(f"wrote {args.out}, {args.out.with_suffix('.png')}, logs in {log_dir}")
    return 1 if failed else 0


def run_one(runner: SweepRunner, workload: str, name: str) -> dict:
    fig = runner.run(workload, name.rsplit("_", 1)[0] if name != "off" else "off")
    fig["variant"] = name
    return fig


def ratios(results: dict[str, dict[str, dict]]) -> None:
    """Each variant's TTFT p50 and throughput against `off`'s, in this run."""
    for variants in results.values():
        off = variants.get("off", {})
        for fig in variants.values():
            if "error" in fig or "error" in off or not off:
                continue
            fig["vs_off"] = {
                "ttft_p50_x": round(off["ttft_p50_s"] / fig["ttft_p50_s"], 3),
                "throughput_x": round(fig["throughput_tok_s"] / off["throughput_tok_s"], 3),
            }


def table(results: dict[str, dict[str, dict]], args) -> str:
    t = Table(
        [
            Column("workload", 9, "{}", left=True),
            Column("variant", 15, "{}", left=True),
            Column("TTFT p50 s", 10, "{:.3f}"),
            Column("p99 s", 8, "{:.3f}"),
            Column("tok/s", 7, "{:.0f}"),
            Column("x off", 6, "{:.2f}"),
            Column("L1 hit", 8, "{}"),
            Column("pool hit", 8, "{}"),
            Column("disk hit", 8, "{}"),
            Column("computed", 9, "{}"),
            Column("disk MB", 8, "{:.0f}", unit=1e6),
        ]
    )
    lines = [t.header()]
    for workload, variants in results.items():
        for name, fig in variants.items():
            if "error" in fig:
                lines.append(f"{workload:9}  {name:15}  FAILED: {fig['error'].splitlines()[0]}")
                continue
            hits = fig["hit_tokens"]
            lines.append(
                t.row(
                    [
                        workload,
                        name,
                        fig["ttft_p50_s"],
                        fig["ttft_p99_s"],
                        fig["throughput_tok_s"],
                        fig.get("vs_off", {}).get("ttft_p50_x"),
                        hits["device"],
                        hits["host"],
                        hits["disk"],
                        fig["computed_tokens"],
                        fig["disk_written_bytes"],
                    ]
                )
            )
    mb = args.row_bytes / 1e6
    lines.append(
        f"budget {args.budget_blocks} blocks ({args.budget_blocks * mb:.0f} MB) of "
        f"{args.block_tokens} tokens, {args.row_bytes} B; pool_disk_N / pool_N: N blocks of "
        f"pool (with / without the "
        f"disk tier), the rest L1"
    )
    return "\n".join(lines)


def chart(results: dict[str, dict[str, dict]], args, path: Path, env: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for workload, variants in results.items():
        for tier in args.tiers:
            xs, ys = [], []
            for n in args.pool_blocks:
                v = variants.get(f"{tier}_{n}", {})
                if "vs_off" in v:
                    xs.append(n)
                    ys.append(v["vs_off"]["ttft_p50_x"])
            if xs:
                style = "-" if tier == "pool_disk" else "--"
                ax.plot(xs, ys, style, marker="o", label=f"{workload} ({tier})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(
        f"pool, KV blocks of {args.block_tokens} tokens (of a {args.budget_blocks}-block "
        f"budget; the rest is L1)"
    )
    ax.set_ylabel("TTFT p50 speed-up over off (L1 = whole budget)")
    ax.legend(fontsize=8)
    ax.set_title(
        f"{Path(args.model).name}; vllm-uma {env['versions']['vllm-uma']}, "
        f"{env['cpu_count']} cores; concurrency {args.concurrency}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
