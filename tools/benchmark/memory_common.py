"""What the two memory benchmarks share: their server, their prompts, a RAM holder.

memory_benchmark.py and memory_pressure.py start the same server (eager, at
a utilization), send distinct token-id prompts, hold RAM in a helper
process, and print the same progress lines.

Runs in the benchmark's process; the RAM holder is a child of its own.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path

from tools.benchmark.lib.log import stamped
from tools.benchmark.lib.prompts import MODEL, prompt_ids
from tools.benchmark.lib.report import write_json
from tools.benchmark.lib.servers import EXE, OFFLINE, StockServer
from vllm_uma import models
from vllm_uma.lifeline import shim_command, supervised_env
from vllm_uma.server_process import Server

GiB = 1 << 30
KINDS = ("plugin", "stock")
say = stamped("memory_benchmark")


def server(kind: str, util: float, log_path: Path, extra: tuple[str, ...] = ()) -> Server:
    """The default model, eager, at ``--gpu-memory-utilization util``:
    `vllm-uma serve` ("plugin") or stock vLLM CPU ("stock")."""
    flags = ["--enforce-eager", "--gpu-memory-utilization", str(util), *extra]
    if kind == "plugin":
        return Server(EXE, flags, log_path, env=OFFLINE)
    model_dir = models.model_dir(None, models.default_cache_root())
    return StockServer(model_dir, MODEL, flags, log_path, env=OFFLINE)


def send_prompts(server: Server, first: int, count: int, length: int, concurrency: int) -> int:
    """Send prompts ``first..first+count-1`` (max_tokens 1); return prompt
    tokens served. Each is seeded by its index and so differs from every
    other from its first token: no prefix cache hits."""

    def one(i: int) -> int:
        payload = {"model": MODEL, "prompt": prompt_ids(i, length), "max_tokens": 1}
        reply = server.post("/v1/completions", {**payload, "temperature": 0}, timeout=600)
        return reply["usage"]["prompt_tokens"]

    pool = concurrent.futures.ThreadPoolExecutor(concurrency)
    try:
        return sum(pool.map(one, range(first, first + count)))
    finally:
        # No waiting on Ctrl-C: the caller stops the server next, which ends
        # the requests still in flight.
        pool.shutdown(wait=False, cancel_futures=True)


def ram_holder(nbytes: int, seconds: float) -> subprocess.Popen:
    """A helper process that allocates ``nbytes`` in 256 MiB steps, prints
    ``held`` once all of it is, holds it ``seconds`` and exits."""
    # bytes * n fills the buffer (a memset), so every page is resident;
    # bytearray(n) alone would come from calloc'd, untouched zero pages.
    code = (
        "import time\n"
        f"want = {nbytes}; step = 256 << 20; held = []\n"
        "while sum(map(len, held)) < want:\n"
        "    held.append(bytearray(b'\\x01') * min(step, want - sum(map(len, held))))\n"
        "print('held', flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    # Under the lifeline watcher: if this benchmark dies, the RAM it holds
    # is given back at once, not after ``seconds``.
    return subprocess.Popen(
        shim_command([sys.executable, "-c", code]),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **supervised_env()},
    )


def finish(out: Path, result: dict, lines: list[str], written: str) -> int:
    """The end of a run: the load then, the JSON, the figures on stdout."""
    result["load_average_end"] = os.getloadavg()
    write_json(out, result)
    print("\n".join(lines))
    say(f"wrote {written}")
    return 0


def prepared(out: Path) -> bool:
    """Ready to measure: the default model built, ``out``'s directory made,
    and a SIGTERM to this script turned into an exception, so that every
    ``finally`` stops its servers, as Ctrl-C does. False if the model cannot
    be built (said on stderr)."""
    try:
        models.prepare()  # idempotent: returns at once once built
    except models.PrepareError as exc:
        say(f"cannot prepare the default model: {exc}")
        return False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out.parent.mkdir(parents=True, exist_ok=True)
    return True
