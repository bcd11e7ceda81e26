"""What the two memory benchmarks share: their server, their prompts, a RAM holder.

memory_benchmark.py and memory_pressure.py start the same server (eager, at
a utilization) on the same ``--model`` (lib/model_choice.py), send distinct
token-id prompts, hold RAM in a helper process, and print the same progress
lines.

Runs in the benchmark's process; the RAM holder is a child of its own.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path

from tools.benchmark.lib import geometry, model_choice
from tools.benchmark.lib.log import stamped
from tools.benchmark.lib.model_choice import ModelChoice
from tools.benchmark.lib.prompts import prompt_ids
from tools.benchmark.lib.report import write_json
from tools.benchmark.lib.servers import EXE, OFFLINE, StockServer
from vllm_uma import models
from vllm_uma.lifeline import shim_command, supervised_env
from vllm_uma.server_process import Server

GiB = 1 << 30
KINDS = ("plugin", "stock")
# prompt_ids (lib/prompts.py) draws every id from [1000, 49000): inside the
# default model's 49,152-token vocabulary, which the model zoo's builds share.
PROMPT_ID_LIMIT = 49_000
say = stamped("memory_benchmark")


def flags(kind: str, choice: ModelChoice, util: float, extra: tuple[str, ...] = ()) -> list[str]:
    """The server's flags: eager, at ``--gpu-memory-utilization util``. The
    plugin's lead with the model's serve args (none for the default model);
    stock is given the model by StockServer."""
    common = ["--enforce-eager", "--gpu-memory-utilization", str(util), *extra]
    return [*choice.serve_args, *common] if kind == "plugin" else common


def server(
    kind: str, choice: ModelChoice, util: float, log_path: Path, extra: tuple[str, ...] = ()
) -> Server:
    """``choice``'s model with :func:`flags`: `vllm-uma serve` ("plugin") or
    stock vLLM CPU ("stock"), both answering to ``choice.served_name``."""
    args = flags(kind, choice, util, extra)
    if kind == "plugin":
        return Server(EXE, args, log_path, env=OFFLINE)
    return StockServer(choice.directory, choice.served_name, args, log_path, env=OFFLINE)


def check_vocabulary(choice: ModelChoice) -> None:
    """Refuse a model that lacks some of the prompts' token ids: it would be
    sent ids it has no embedding for."""
    config = geometry.model_config(choice.directory)
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    where = choice.directory / "config.json"
    if vocab is None:
        raise SystemExit(
            f"{choice.served_name}: {where} has no vocab_size, and the prompts are token ids "
            f"up to {PROMPT_ID_LIMIT - 1:,}: add the model's vocab_size to its config.json "
            f"or choose another model"
        )
    if vocab < PROMPT_ID_LIMIT:
        raise SystemExit(
            f"{choice.served_name}: vocab_size={vocab:,} in {where} is too small: the prompts "
            f"are token ids up to {PROMPT_ID_LIMIT - 1:,} (prompt_ids, "
            f"tools/benchmark/lib/prompts.py), so the model needs {PROMPT_ID_LIMIT:,} tokens "
            f"or more. Choose a model with a larger vocabulary (every model zoo build has "
            f"49,152: python -m tools.model_zoo list)"
        )


def send_prompts(
    server: Server, model: str, first: int, count: int, length: int, concurrency: int
) -> int:
    """Send prompts ``first..first+count-1`` to ``model`` (max_tokens 1);
    return prompt tokens served. Each is seeded by its index and so differs
    from every other from its first token: no prefix cache hits."""

    def one(i: int) -> int:
        payload = {"model": model, "prompt": prompt_ids(i, length), "max_tokens": 1}
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


def prepared(out: Path, model: str | None) -> ModelChoice | None:
    """Ready to measure: ``--model`` chosen (the default model or a zoo
    build built if missing; idempotent) and its vocabulary checked,
    ``out``'s directory made, and a SIGTERM to this script turned into an
    exception, so that every ``finally`` stops its servers, as Ctrl-C does.
    None if the model cannot be built (said on stderr)."""
    try:
        choice = model_choice.choose(model)
    except (models.PrepareError, ValueError) as exc:
        say(f"cannot prepare {model or 'the default model'}: {exc}")
        return None
    check_vocabulary(choice)
    say(f"model: {choice.describe()}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out.parent.mkdir(parents=True, exist_ok=True)
    return choice
