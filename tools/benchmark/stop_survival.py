"""What each way of stopping a server keeps on disk: ``python -m
tools.benchmark.stop_survival``.

For each way of stopping (Ctrl-C and Ctrl-C twice as a terminal sends
them: SIGINT to every process of the server's process group, API server
and engine core at once; SIGTERM to the API server as systemd's
KillMode=mixed and docker send it; kill -9 of the API server alone; kill
-9 of every process as the OOM killer or a power cut would), a fresh `vllm-uma serve` of the
default model with a host pool and a disk tier serves PROMPTS prompts of
TOKENS tokens one after another (max_tokens 1). Right after the last reply,
while its blocks are still on their way to disk, the server is stopped that
way. Printed per way: the full blocks of the prompts that are on disk
afterwards (a later server restores them; the rest is recomputed) out of
the prompts' full blocks at the block size the server runs (vllm-uma's
default, 32 tokens: 48 block files a 1,536-token prompt, the same bytes as
12 of 128), the temp files left, and how long the stop took. Nothing else runs meanwhile (two
cores: one server at a time).

``--during-start 5 20 40``: instead, a server is stopped each way that many
seconds after it was started, before it is ready (importing vLLM, loading
the model, starting the engine core, warming up), and how long until none
of its processes is left is printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import psutil
import requests

from tools.benchmark.lib import prompts, servers
from vllm_uma.kv_offload.disk import block_file

STOP_WAIT_S = 90.0  # past the server's own deadlines (20 s drain, 5 s tier, 60 s grace)
WAYS = ("ctrl_c", "ctrl_c_twice", "sigterm", "kill_9_api_server", "kill_9_all")


def session(pid: int) -> list[psutil.Process]:
    """Every live process of the session ``pid`` leads (the server's)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def stop(server: servers.Server, way: str) -> float:
    """Stop ``server`` ``way``; seconds until none of its processes is left."""
    pid = server.proc.pid
    started = time.monotonic()
    if way == "ctrl_c":  # the server leads its own session and group
        os.killpg(pid, signal.SIGINT)
    elif way == "ctrl_c_twice":
        os.killpg(pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(pid, signal.SIGINT)
    elif way == "sigterm":
        server.proc.send_signal(signal.SIGTERM)
    elif way == "kill_9_api_server":
        server.proc.send_signal(signal.SIGKILL)
    else:
        os.killpg(pid, signal.SIGKILL)
    while session(pid) and time.monotonic() - started < STOP_WAIT_S:
        time.sleep(0.1)
    took = time.monotonic() - started
    server.stop()  # reaps, and kills what outlived the wait
    return took


def expected_blocks(prompt_count: int, tokens: int, serve_args: list[str]) -> int:
    """The prompts' full blocks (one block file each: the default model has
    one KV cache group) at the block size ``serve_args`` give the server."""
    return prompt_count * (tokens // servers.block_tokens(serve_args))


def measure(way: str, prompt_count: int, tokens: int, work: Path, kv_events: bool) -> dict:
    root = work / way / "kv"
    root.parent.mkdir(parents=True)
    args = ["--kv-offloading-size", "0.5", *servers.disk_tier_args(root, cap_gib=4)]
    if kv_events:  # the publisher's shutdown runs before the disk tier's
        args += ["--kv-events-config", '{"enable_kv_cache_events": true}']
    server = servers.start(args, work / way / "server.log", env=servers.OFFLINE)
    try:
        for i in range(prompt_count):
            server.complete(prompts.MODEL, prompts.prompt_ids(i, tokens), max_tokens=1)
        took = stop(server, way)
    finally:
        server.stop()
    noindex = root / ".noindex"
    kept = list(noindex.rglob(f"*{block_file.BLOCK_SUFFIX}"))
    temps = [p for p in noindex.rglob("*") if block_file.is_temp_name(p.name)]
    return dict(
        way=way,
        expected=expected_blocks(prompt_count, tokens, args),
        kept=len(kept),
        temps=len(temps),
        stop_s=took,
    )


def stop_during_start(way: str, after_s: float, work: Path) -> tuple[bool, float]:
    """(whether it was still starting, seconds its stop took)."""
    log = work / f"start-{way}-{after_s:g}" / "server.log"
    log.parent.mkdir(parents=True)
    root = log.parent / "kv"
    args = ["--kv-offloading-size", "0.5", *servers.disk_tier_args(root, cap_gib=4)]
    server = servers.Server(servers.EXE, args, log, env=servers.OFFLINE)
    try:
        time.sleep(after_s)
        starting = server.proc.poll() is None and not _healthy(server)
        return starting, stop(server, way)
    finally:
        server.stop()


def _healthy(server: servers.Server) -> bool:
    try:
        return requests.get(f"{server.url}/health", timeout=0.5).ok
    except requests.RequestException:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark.stop_survival")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1536)
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument(
        "--kv-events", action="store_true", help="serve with KV cache events on (private socket)"
    )
    parser.add_argument(
        "--during-start", nargs="+", type=float, metavar="S", default=None,
        help="stop each way S seconds after the start instead, before it is ready",
    )  # fmt: skip
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vllm-uma-stop-"))
    if args.during_start:
        print(f"a stop during the start-up; work in {work}")
        print(f"{'way of stopping':<20} {'after s':>8} {'starting':>9} {'stop s':>7}")
        for way in args.ways:
            for after_s in args.during_start:
                starting, took = stop_during_start(way, after_s, work)
                print(f"{way:<20} {after_s:>8g} {starting!s:>9} {took:>7.1f}", flush=True)
        return 0
    events = "on" if args.kv_events else "off"
    print(
        f"{args.prompts} prompts of {args.tokens} tokens each, then a stop; KV events "
        f"{events}; work in {work}"
    )
    print(f"{'way of stopping':<20} {'blocks on disk':>15} {'of':>5} {'temps':>6} {'stop s':>7}")
    for way in args.ways:
        row = measure(way, args.prompts, args.tokens, work, args.kv_events)
        print(
            f"{way:<20} {row['kept']:>15} {row['expected']:>5} {row['temps']:>6} "
            f"{row['stop_s']:>7.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
