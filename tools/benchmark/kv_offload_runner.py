"""The server side of the KV offloading benchmark: each variant's flags, the
traffic of each workload sized from the server's own memory breakdown, and
one fresh server (two for a disk-tier restart) per workload and variant.

The workloads' settings, geometry and prompts are kv_offload_workloads.py's.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import requests

from tools.benchmark.kv_offload_client import (
    PassResult,
    diff,
    run_pass,
    scrape,
    stream_completion,
    wait_quiet,
)
from tools.benchmark.kv_offload_report import summarize
from tools.benchmark.kv_offload_workloads import Settings, Sizing, Traffic, build_traffic
from tools.benchmark.lib import servers
from tools.benchmark.lib.floors import drop_page_cache
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.servers import disk_tier_args
from vllm_uma.kv_offload.disk.store_scan import tree_bytes
from vllm_uma.server_process import Server


class Runner:
    def __init__(self, settings: Settings, bandwidth: dict, log_dir: Path):
        self.s = settings
        self.bandwidth = bandwidth
        self.log_dir = log_dir
        self.sizing: Sizing | None = None
        self.traffic: dict[str, Traffic] = {}
        self.warnings: list[str] = []

    def server_args(self, variant: str, disk_root: Path | None) -> list[str]:
        s = self.s
        args = [s.model, "--max-model-len", str(s.max_model_len)]
        args += ["--kv-cache-memory-bytes", str(self.l1_bytes(variant))]
        args += list(s.server_args)
        staged = variant == "pool_disk" and s.staging_pool
        if variant != "off" and not staged:
            args += ["--kv-offloading-size", f"{s.pool_gib:g}"]
        if variant == "pool_disk":
            args += disk_tier_args(disk_root, s.disk_cap_gib, auto_pool=staged)
        return args

    def l1_bytes(self, variant: str) -> int:
        """A variant's L1. With more memory, every variant has ``l1_bytes``
        and the pool on top. At equal memory, every variant has the same
        budget, ``l1_bytes`` + the pool: `off` all of it as L1, `pool` its
        pool and the rest, `pool_disk` with the server's own staging pool
        (staging_pool) that pool and the rest."""
        s = self.s
        if not s.equal_memory:
            return s.l1_bytes
        budget = s.l1_bytes + s.pool_bytes
        if variant == "off":
            return budget
        if variant == "pool_disk" and s.staging_pool:
            return budget - s.staging_bytes
        return s.l1_bytes

    def run(self, workload: str, variant: str) -> dict:
        disk_root = None
        if variant == "pool_disk":
            disk_root = self.s.disk_dir / f"kv-bench-disk-{os.getpid()}-{workload}"
        args = self.server_args(variant, disk_root)
        try:
            return {**self._run(workload, variant, args, disk_root), "server_args": args}
        except (RuntimeError, TimeoutError, OSError, requests.RequestException) as exc:
            message = failure(exc)
            progress(f"{workload}/{variant}: FAILED: {message.splitlines()[0]}")
            return {"error": message, "server_args": args}
        finally:
            if disk_root is not None and not self.s.keep_disk:
                shutil.rmtree(disk_root, ignore_errors=True)

    def _run(self, workload: str, variant: str, args: list[str], disk_root: Path | None) -> dict:
        extra = {}
        name = f"{workload}-{variant}"
        if workload == "restart" and disk_root is not None:
            extra["writer"] = self._write(args, name, disk_root)
        server, breakdown = self.start(args, name)
        try:
            traffic = self.traffic_for(workload)
            # restart: the fresh server sees the traffic for the first time.
            if traffic.warmup and workload != "restart":
                run_pass(server.url, list(traffic.warmup), *self._pass_opts("warm-up"))
                wait_quiet(server.url)
            before = scrape(server.url)
            result = self._measure(server.url, traffic.passes)
            counters = diff(scrape(server.url), before)
            # Our server keeps about `cores` threads busy; more load is others'.
            extra["loadavg_1m"] = round(os.getloadavg()[0], 2)
        finally:
            server.stop()
        fig = summarize(result, counters, self.sizing.kv_per_token, self.bandwidth)
        progress(
            f"{name}: TTFT p50 {fig['ttft_p50_s']:.3f} s, {fig['throughput_tok_s']:.0f} tok/s, "
            f"hits {fig['hit_tokens']}"
        )
        return {**fig, **extra, "memory_breakdown": breakdown, "log": str(server.log_path)}

    def _measure(self, url: str, passes: tuple[tuple[str, ...], ...]) -> PassResult:
        """Every measured pass, one after the other, each after the stores of
        the one before have reached their tiers (as after the warm-up); the
        replies of all of them, and the time spent serving them."""
        replies, wall = [], 0.0
        for i, prompts in enumerate(passes):
            if i:
                wait_quiet(url)
            label = f"measured {i + 1}/{len(passes)}" if len(passes) > 1 else "measured"
            result = run_pass(url, list(prompts), *self._pass_opts(label))
            replies += result.replies
            wall += result.wall_s
        return PassResult(replies, wall)

    def _write(self, args: list[str], name: str, disk_root: Path) -> dict:
        """restart with a disk tier: a first server serves the traffic and
        stops; its blocks are then dropped from the page cache, so the next
        server reads them from the disk, not from RAM."""
        server, _ = self.start(args, name + "-writer")
        try:
            traffic = self.traffic_for("restart")
            run_pass(server.url, list(traffic.warmup), *self._pass_opts("writer"))
            wait_quiet(server.url)
        finally:
            server.stop()
        on_disk = tree_bytes(disk_root)
        dropped = drop_page_cache(disk_root)
        progress(f"{name}: writer stopped, {on_disk / 2**20:.0f} MiB on disk, page cache dropped")
        return {"log": str(server.log_path), "disk_bytes": on_disk, "page_cache_dropped": dropped}

    def _pass_opts(self, label: str) -> tuple:
        return (self.s.max_tokens, self.s.concurrency, label, self.s.model)

    def start(self, args: list[str], name: str) -> tuple[Server, dict[str, int]]:
        progress(f"{name}: starting a fresh server")
        server = servers.start(args, self.log_dir / f"{name}.log")
        try:
            breakdown = servers.breakdown(server)
            self._size_from(breakdown, args)
            # First-request set-up, unmeasured.
            stream_completion(server.url, "Hello", 2, self.s.model)
        except BaseException:
            server.stop()
            raise
        return server, breakdown

    def _size_from(self, b: dict[str, int], args: list[str]) -> None:
        if self.sizing is None:
            per = b["per_block_bytes"]
            l1_blocks = self.s.l1_bytes // per
            self.sizing = Sizing(
                block_size=b["block_size"],
                per_block_bytes=per,
                l1_blocks=l1_blocks,
                pool_blocks=self.s.pool_bytes // per,
                kv_groups=b["kv_groups"],
                # The server's own (group-aware) capacity, scaled to l1_bytes:
                # at equal memory the first server may be `off`, whose L1 is
                # the whole budget, and the traffic must not depend on which
                # variant started first.
                l1_capacity_tokens=b["max_tokens_cached"] * l1_blocks // b["num_blocks"],
            )
            self._check_concurrency()
        row = self.bandwidth.get("row_bytes")
        if row is not None and row != b["per_block_bytes"]:
            self.warnings.append(
                f"the disk reference read blocks of {row} B, the server's are "
                f"{b['per_block_bytes']} B (its breakdown line): the disk floor is off"
            )
        if "--kv-offloading-size" not in args and "OffloadingConnector" in " ".join(args):
            if b["kv_offload_pool"] != self.s.staging_bytes:
                self.warnings.append(
                    f"the server's staging pool is {b['kv_offload_pool']} bytes, the benchmark "
                    f"gave L1 the budget less {self.s.staging_bytes}: not equal memory"
                )
        given = int(args[args.index("--kv-cache-memory-bytes") + 1])
        if b["num_blocks"] != given // self.sizing.per_block_bytes:
            self.warnings.append(
                f"a server given {given} bytes of L1 reports {b['num_blocks']} blocks, not "
                f"{given // self.sizing.per_block_bytes}: the sizing may be off"
            )

    def _check_concurrency(self) -> None:
        z, s = self.sizing, self.s
        need = s.concurrency * z.blocks(s.prompt_tokens + s.max_tokens)
        if need > z.l1_blocks:
            self.warnings.append(
                f"L1 ({z.l1_blocks} blocks) cannot hold {s.concurrency} requests of "
                f"{s.prompt_tokens} tokens at once ({need} blocks): TTFT includes queueing"
            )

    def traffic_for(self, workload: str) -> Traffic:
        if workload not in self.traffic:
            self.traffic[workload] = build_traffic(workload, self.s, self.sizing)
        return self.traffic[workload]

    def sizing_report(self) -> dict:
        if self.sizing is None:
            return {}
        z = self.sizing
        shape = {
            w: {"warmup": len(t.warmup), "measured": sum(len(p) for p in t.passes)}
            for w, t in self.traffic.items()
        }
        return {
            "block_size": z.block_size,
            "per_block_bytes": z.per_block_bytes,
            "kv_groups": z.kv_groups,
            "kv_bytes_per_token": z.kv_per_token,
            "l1_blocks": z.l1_blocks,
            "l1_tokens": z.l1_tokens,
            "pool_blocks": z.pool_blocks,
            "requests": shape,
        }


def failure(exc: BaseException) -> str:
    """The line that says why (a server's refusal names the flag), then the
    log tail."""
    message = str(exc)
    errors = [x.strip() for x in message.splitlines() if re.search(r"error", x, re.I)]
    head = errors[-1] if errors else (message.splitlines() or [repr(exc)])[0]
    return f"{head}\n{message[-3000:]}"
