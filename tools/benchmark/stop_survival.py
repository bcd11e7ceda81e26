"""What each way of stopping a server keeps on disk: ``python -m
tools.benchmark.stop_survival``.

For each way of stopping (Ctrl-C, Ctrl-C twice, SIGTERM as systemd and
docker send it, kill -9 of the API server alone, kill -9 of every process
as the OOM killer or a power cut would), a fresh `vllm-uma serve` of the
default model with a host pool and a disk tier serves PROMPTS prompts of
TOKENS tokens one after another (max_tokens 1). Right after the last reply,
while its blocks are still on their way to disk, the server is stopped that
way. Printed per way: the full blocks of the prompts that are on disk
afterwards (a later server restores them; the rest is recomputed), the temp
files left, and how long the stop took. Nothing else runs meanwhile (two
cores: one server at a time).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import psutil

from tools.benchmark.lib import prompts, servers
from vllm_uma.kv_offload.disk import block_file

BLOCK_TOKENS = 128  # vLLM CPU's KV block
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
    if way == "ctrl_c":
        server.proc.send_signal(signal.SIGINT)
    elif way == "ctrl_c_twice":
        server.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGINT)
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


def measure(way: str, prompt_count: int, tokens: int, work: Path) -> dict:
    root = work / way / "kv"
    root.parent.mkdir(parents=True)
    args = ["--kv-offloading-size", "0.5", *servers.disk_tier_args(root, cap_gib=4)]
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
        expected=prompt_count * (tokens // BLOCK_TOKENS),
        kept=len(kept),
        temps=len(temps),
        stop_s=took,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark.stop_survival")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1536)
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vllm-uma-stop-"))
    print(f"{args.prompts} prompts of {args.tokens} tokens each, then a stop; work in {work}")
    print(f"{'way of stopping':<20} {'blocks on disk':>15} {'of':>5} {'temps':>6} {'stop s':>7}")
    for way in args.ways:
        row = measure(way, args.prompts, args.tokens, work)
        print(
            f"{way:<20} {row['kept']:>15} {row['expected']:>5} {row['temps']:>6} "
            f"{row['stop_s']:>7.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
