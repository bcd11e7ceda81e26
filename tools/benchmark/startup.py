"""Where a start of `vllm-uma serve` spends its time, beside stock vLLM's.

    .venv/bin/python -m tools.benchmark.startup [--model zoo-qwen3-real] [--no-stock] [--tiers]

For one model, one run, in this order: vllm-uma compiled with an empty vLLM
compile cache (a new machine: cold), compiled again with the cache the cold
start left (a restart: warm), eager; then stock `vllm serve` (vLLM's OpenAI
server, no plugin) the same three ways with a cache of its own. Each start
is a fresh server with the same flags (``--max-model-len``), and its phases
are read off its log as the lines arrive (stamped by this tool every 20 ms,
not by the log's one-second clock):

    imports     launch -> the engine core starts (API server imports, config)
    weights     -> "Loading weights took" (engine core imports, weights)
    compile     -> the model is compiled and saved, or loaded from the cache
    warm-up     -> "Warming up done." (vLLM's first forward at full batch)
    kv cache    -> "init engine ... took" (KV cache allocated)
    tiers       -> "Starting vLLM server" (scheduler, KV offloading tiers)
    /health     -> the first /health that answers 200

It prints the phases per start, and the warm start's time to /health over
the cold start's against the 0.4x target (issue 42). ``--tiers`` gives
vllm-uma's starts a host pool and a disk tier (stock vLLM refuses KV
offloading on CPU), so that their start-up shows. The machine is shared: compare
ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.benchmark.lib import model_choice, servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.log import progress
from vllm_uma.server_process import Server

TARGET = 0.4
POLL_S = 0.02

# Phase -> the log line that ends it (a regular expression), in order.
PHASES = (
    ("imports", r"Initializing a V1 LLM engine"),
    # vLLM CPU's loader logs "Loading weights took"; the GPU runner "Model loading took".
    ("weights", r"Loading weights took|Model loading took"),
    ("compile", r"saved AOT compiled function|Directly load AOT compilation"),
    ("warm-up", r"Warming up done\."),
    ("kv cache", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("tiers", r"Starting vLLM server on"),
)
HEALTH = "/health"


@dataclass
class StampedLog:
    """The lines of a server's log, each with when this tool first saw it."""

    path: Path
    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def follow(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        offset, partial = 0, ""
        while not self._stop.is_set():
            if self.path.exists():
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                now = time.perf_counter() - self.started
                *whole, partial = (partial + chunk).split("\n")
                self.lines.extend((now, line) for line in whole)
            time.sleep(POLL_S)

    def stop(self) -> None:
        self._stop.set()

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        regex = re.compile(pattern)
        return next((t for t, line in self.lines if t >= after and regex.search(line)), None)

    def has(self, pattern: str) -> bool:
        return self.first(pattern) is not None


def phases(log: StampedLog, health_s: float) -> dict[str, float]:
    """Each phase's seconds; a phase whose line never came (eager has no
    compile or warm-up) takes none."""
    out, last = {}, 0.0
    for name, pattern in PHASES:
        at = log.first(pattern, after=last)
        out[name] = 0.0 if at is None else at - last
        last = last if at is None else at
    out[HEALTH] = health_s - last
    return out


def how_compiled(log: StampedLog) -> str:
    if log.has(r"Directly load AOT compilation"):
        return "loaded"
    if log.has(r"Compiling model again due to a load failure"):
        return "load failed, compiled"
    if log.has(r"saved AOT compiled function"):
        return "compiled"
    return "-"


def start_once(server_factory, log_path: Path) -> dict[str, object]:
    started = time.perf_counter()
    log = StampedLog(log_path, started)
    log.follow()
    server = server_factory()
    try:
        server.wait_ready(1800)
        health_s = time.perf_counter() - started
    finally:
        server.stop()
        time.sleep(0.2)  # the last lines
        log.stop()
    return {"health_s": health_s, "phases": phases(log, health_s), "compile": how_compiled(log)}


def run(choice, args, tmp: Path) -> list[dict[str, object]]:
    flags = [*choice.serve_args, "--max-model-len", str(args.max_model_len)]
    rows = []
    for kind in ("vllm-uma", "stock vLLM") if args.stock else ("vllm-uma",):
        cache = {**servers.OFFLINE, "VLLM_CACHE_ROOT": str(tmp / f"cache-{len(rows)}")}
        extra = tier_flags(tmp / f"kv-{len(rows)}") if args.tiers and kind == "vllm-uma" else []
        for mode, mode_flags in (("cold", []), ("warm", []), ("eager", ["--enforce-eager"])):
            log_path = tmp / f"{kind.replace(' ', '-')}-{mode}.log"
            progress(f"{kind}, {mode} start of {choice.served_name} ...")

            def factory(
                kind=kind, mode_flags=mode_flags, extra=extra, log_path=log_path, cache=cache
            ):
                if kind == "vllm-uma":
                    return Server(servers.EXE, [*flags, *mode_flags, *extra], log_path, env=cache)
                return servers.StockServer(
                    choice.directory,
                    choice.served_name,
                    ["--max-model-len", str(args.max_model_len), *mode_flags],
                    log_path,
                    env=cache,
                )

            row = start_once(factory, log_path)
            rows.append({"server": kind, "mode": mode, **row})
            progress(f"  ready in {row['health_s']:.1f} s ({row['compile']})")
    return rows


def tier_flags(root: Path) -> list[str]:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 2}
    config = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return ["--kv-offloading-size", "1", "--kv-transfer-config", json.dumps(config)]


def report(choice, rows, env) -> None:
    print(
        f"start-up of {choice.describe()}; commit {env['git_commit']}, {env['cpu_model']}, "
        f"load before {env['loadavg_before'][0]:.1f}; seconds"
    )
    names = [name for name, _ in PHASES] + [HEALTH]
    print(
        f"{'server':11} {'start':6} {'total':>7} "
        + " ".join(f"{n:>8}" for n in names)
        + "  compiled model"
    )
    for row in rows:
        cells = " ".join(f"{row['phases'][n]:8.1f}" for n in names)
        print(
            f"{row['server']:11} {row['mode']:6} {row['health_s']:7.1f} {cells}  {row['compile']}"
        )
    for kind in dict.fromkeys(row["server"] for row in rows):
        by_mode = {row["mode"]: row for row in rows if row["server"] == kind}
        ratio = by_mode["warm"]["health_s"] / by_mode["cold"]["health_s"]
        verdict = "meets" if ratio <= TARGET else "misses"
        print(f"{kind}: warm start {ratio:.2f}x the cold one ({verdict} the {TARGET}x target)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_choice.add_argument(ap)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument(
        "--no-stock", dest="stock", action="store_false", help="vllm-uma's three starts only"
    )
    ap.add_argument(
        "--tiers", action="store_true", help="vllm-uma with a host pool and a disk tier"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args()
    env = environment(args)
    choice = model_choice.choose(args.model)
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        rows = run(choice, args, Path(tmp))
    report(choice, rows, env)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"environment": env, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
