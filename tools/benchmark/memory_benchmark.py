"""Worker memory of vllm-uma serve against stock vLLM CPU, same model and flags.

    .venv/bin/python -m tools.benchmark.memory_benchmark [--startup-under-pressure 6]
        [--model zoo-qwen3-real]
    .venv/bin/python -m tools.benchmark.memory_benchmark --pressure --out F.json

--pressure runs the KV memory release benchmark instead, with the flags
that follow (memory_pressure.py, also run as its own module).

Each server (the plugin, then stock vLLM CPU with VLLM_PLUGINS="") serves
``--model`` (the default model, a model zoo build or a directory:
lib/model_choice.py; the plugin's KV bytes per block are checked against
the model's config.json at the block size of its command line: each server
runs its own default, vllm-uma 32 tokens, stock vLLM CPU 128) on a free
loopback port; the worker's RSS is read
at ready and after each cumulative amount of prompt tokens served (distinct
prompts, max_tokens=1).
KV cache size: the plugin's ``memory breakdown:`` line, stock's "GiB for KV
cache" line. Target: the plugin's worker RSS at ready <= weights +
activations + 5% of its KV cache (the KV buffer is lazy); stock's RSS at
ready already holds its whole KV cache (torch.zeros).

--startup-under-pressure GIB holds GIB of touched RAM in a helper process and
tries to start each server at utilization 0.9 (stock wants the whole budget
free now; the plugin treats it as a ceiling). Every process started here has
its own session, stopped even on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from pathlib import Path

import psutil

from tools.benchmark import memory_pressure
from tools.benchmark.lib import model_choice, servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.model_choice import ModelChoice
from tools.benchmark.lib.report import Column, Table, gib
from tools.benchmark.memory_common import (
    KINDS,
    GiB,
    finish,
    prepared,
    ram_holder,
    say,
    send_prompts,
    server,
)
from tools.harness.server import model_process
from vllm_uma.server_process import Server

STOCK_KV_RE = re.compile(r"\(([\d.]+)/([\d.]+)\) GiB for KV cache")
# Stock's refusals all start this way (cpu_worker.py, start-up and KV sizing).
REFUSAL_RE = re.compile(r"Available memory on node .*")
ROWS = Table(
    [
        Column("server", 7, left=True),
        Column("tokens served", 13),
        Column("worker RSS GiB", 14),
        Column("KV cache GiB", 12),
    ]
)


def worker_rss(srv: Server) -> int | None:
    """RSS of the process that runs the model (worker, or engine core with 'uni')."""
    try:
        return model_process(srv.proc.pid).memory_info().rss
    except (LookupError, psutil.Error):
        return None


def kv_cache_bytes(kind: str, srv: Server, choice: ModelChoice) -> tuple[int | None, dict | None]:
    """(KV cache bytes, plugin breakdown) read from the server's log; the
    run stops if the plugin's KV is not ``choice``'s."""
    if kind == "plugin":
        try:
            breakdown = servers.breakdown(srv)
        except RuntimeError:
            return None, None
        # The block size the server was started with (its command line).
        block = servers.block_tokens(list(srv.proc.args))
        model_choice.check_breakdown(choice, breakdown, block)
        return breakdown["kv_cache"], breakdown
    m = STOCK_KV_RE.search(srv.log())
    # Stock logs GiB rounded to 2 decimals: good to about 5 MiB.
    return (int(float(m.group(1)) * GiB) if m else None), None


def measure(kind: str, choice: ModelChoice, args, out_dir: Path) -> dict:
    log_path = out_dir / f"{kind}.log"
    srv = server(kind, choice, args.gpu_memory_utilization, log_path)
    result: dict = {"server": kind, "command": srv.proc.args, "log": str(log_path), "rows": []}
    say(f"starting {kind} on port {srv.port} (log {log_path})")
    with servers.running(srv):
        if not servers.ready(srv, args.ready_timeout):
            result["refused"] = refusal_line(srv.log())
            say(f"{kind} exited before ready: {result['refused']}")
            return result
        result["kv_cache"], result["breakdown"] = kv_cache_bytes(kind, srv, choice)
        sent = tokens = 0
        for target in sorted(args.tokens):
            need = -(-target // args.prompt_tokens) - sent  # ceil division
            if need > 0:
                say(f"{kind}: sending {need} prompts of {args.prompt_tokens} tokens")
                tokens += send_prompts(
                    srv, choice.served_name, sent, need, args.prompt_tokens, args.concurrency
                )
                sent += need
            rss = worker_rss(srv)
            result["rows"].append(
                {"target_tokens": target, "tokens_served": tokens, "worker_rss": rss}
            )
            say(f"{kind}: {tokens} tokens served, worker RSS {gib(rss)} GiB")
    return result


def refusal_line(log_text: str) -> str:
    m = REFUSAL_RE.search(log_text)
    if m:
        return m.group(0).strip()
    # vllm-uma prints "vllm-uma serve: error: ..."; vLLM a "...Error: ..." traceback.
    errors = [line for line in log_text.splitlines() if "error" in line.lower()]
    return errors[-1].strip() if errors else "exited before ready (see log)"


@contextlib.contextmanager
def held_ram(gib_: float):
    """A helper process that holds ``gib_`` GiB of touched RAM, until stopped."""
    proc = ram_holder(int(gib_ * GiB), 1e6)
    try:
        if proc.stdout.readline().strip() != "held":
            raise RuntimeError(f"could not hold {gib_} GiB of RAM (helper exited {proc.poll()})")
        say(
            f"holding {gib_} GiB in pid {proc.pid}; available now "
            f"{psutil.virtual_memory().available / GiB:.2f} GiB"
        )
        yield proc
    finally:
        proc.kill()
        proc.wait()


def startup_under_pressure(args, choice: ModelChoice, out_dir: Path) -> dict:
    util = 0.9
    result: dict = {"held_gib": args.startup_under_pressure, "utilization": util}
    with held_ram(args.startup_under_pressure):
        result["ram_available_gib"] = round(psutil.virtual_memory().available / GiB, 2)
        for kind in KINDS:
            log_path = out_dir / f"{kind}-pressure.log"
            say(f"pressure: starting {kind} at utilization {util} (log {log_path})")
            entry = result[kind] = start_held(kind, choice, util, log_path, args.ready_timeout)
            state = "started" if entry["started"] else "refused: " + entry["refusal"]
            say(f"pressure: {kind} {state}")
    return result


def start_held(kind: str, choice: ModelChoice, util: float, log_path: Path, timeout: float) -> dict:
    """One server's start with the RAM held: what it had, or why it refused."""
    with servers.running(server(kind, choice, util, log_path)) as srv:
        try:
            ok = servers.ready(srv, timeout)
        except TimeoutError as exc:  # a hang is a result here, not a crash
            ok, reason = False, str(exc)
        entry = {"started": ok, "log": str(log_path)}
        if ok:
            entry["worker_rss"] = worker_rss(srv)
            entry["kv_cache"] = kv_cache_bytes(kind, srv, choice)[0]
        elif srv.proc.poll() is not None:
            entry["refusal"] = refusal_line(srv.log())
        else:
            entry["refusal"] = reason
    return entry


def report(servers: list[dict], pressure: dict | None) -> list[str]:
    lines = [ROWS.header()]
    for s in servers:
        if "refused" in s or "error" in s:
            lines.append(f"{s['server']:<7} did not run: {s.get('refused') or s['error']}")
        for row in s["rows"]:
            lines.append(
                ROWS.row(
                    [s["server"], row["tokens_served"], gib(row["worker_rss"]), gib(s["kv_cache"])]
                )
            )
    plugin = next((s for s in servers if s["server"] == "plugin" and s.get("breakdown")), None)
    if plugin and plugin["rows"] and plugin["rows"][0]["worker_rss"] is not None:
        b, rss = plugin["breakdown"], plugin["rows"][0]["worker_rss"]
        limit = b["weights"] + b["activations"] + 0.05 * b["kv_cache"]
        plugin["target"] = {"rss_at_ready": rss, "limit": int(limit), "held": rss <= limit}
        lines.append(
            f"target: plugin RSS at ready {gib(rss)} <= weights {gib(b['weights'])} + "
            f"activations {gib(b['activations'])} + 5% of KV {gib(b['kv_cache'])} = "
            f"{gib(int(limit))} GiB: {'HELD' if rss <= limit else 'MISSED'}"
        )
    stock = next((s for s in servers if s["server"] == "stock" and s["rows"]), None)
    if stock:
        lines.append(
            f"stock: RSS at ready {gib(stock['rows'][0]['worker_rss'])} GiB, "
            f"KV cache {gib(stock['kv_cache'])} GiB"
        )
    if pressure:
        for kind in KINDS:
            e = pressure.get(kind, {})
            state = "started" if e.get("started") else f"refused: {e.get('refusal')}"
            lines.append(f"utilization 0.9 with {pressure['held_gib']} GiB held: {kind} {state}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[0, 16384, 65536, 131072],
        help="cumulative prompt tokens after which RSS is read",
    )
    p.add_argument("--prompt-tokens", type=int, default=2000, help="tokens per prompt")
    p.add_argument("--concurrency", type=int, default=4, help="prompts in flight")
    p.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for /health")
    p.add_argument("--servers", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument(
        "--startup-under-pressure",
        type=float,
        metavar="GIB",
        help="also try starting each server at 0.9 with GIB of RAM held",
    )
    p.add_argument(
        "--pressure",
        action="store_true",
        help="instead: burst, idle, memory hog, revisit, with the KV memory release and "
        "without it; the flags after it are memory_pressure.py's "
        "(python -m tools.benchmark.memory_pressure --help)",
    )
    p.add_argument("--out", type=Path, default=Path("bench-out/memory_benchmark.json"))
    model_choice.add_argument(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--pressure" in argv:
        return memory_pressure.main([a for a in argv if a != "--pressure"])
    args = parse_args(argv)
    choice = prepared(args.out, args.model)
    if choice is None:
        return 2
    out_dir = args.out.parent
    result = {
        "environment": environment(args),
        "model": choice.describe(),
        "servers": [],
        "startup_under_pressure": None,
    }
    for kind in args.servers:
        try:
            result["servers"].append(measure(kind, choice, args, out_dir))
        except (OSError, TimeoutError, ValueError) as exc:  # record, go on to the next server
            say(f"{kind} failed: {exc!r}")
            result["servers"].append({"server": kind, "error": repr(exc), "rows": []})
    if args.startup_under_pressure:
        result["startup_under_pressure"] = startup_under_pressure(args, choice, out_dir)
    lines = report(result["servers"], result["startup_under_pressure"])
    return finish(args.out, result, [f"model: {result['model']}", *lines], str(args.out))


if __name__ == "__main__":
    sys.exit(main())
