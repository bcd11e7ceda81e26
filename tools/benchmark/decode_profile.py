"""Where a decode step of one request goes: py-spy on vllm-uma's engine core.

    .venv/bin/python -m tools.benchmark.decode_profile [--model M] [--dtype bfloat16]
        [--tokens 256] [--rate 250] [--serve-args "--block-size 128"]
        [--out bench-out/decode_profile.json]

Issue 43 asks for decode at llama.cpp's speed and, for what stays slower,
where the time goes. One request decodes ``--tokens`` tokens (ignore_eos,
a 32-token prompt, the peer benchmark's decode workload) twice on one
server: first unobserved, for the rate; then with py-spy sampling the
engine core (``py-spy record --nonblocking``: it reads the process's memory
without stopping it), for the profile. The second rate against the first
says what the sampling cost.

The engine core is one process (vLLM's EngineCoreProc; the worker runs in
it, executor ``uni``): its main thread runs the engine loop (schedule,
execute the model, update), a second Python thread writes outputs to the
API server. py-spy sees Python frames only: time inside torch's kernels is
charged to the Python line that called them (the model's forward), which
is what we want to separate from the per-step Python around it. Samples
are classified by the first matching rule over the whole stack (RULES);
py-spy drops idle samples (a thread blocked in a wait), so the shares are
of busy time, and busy samples over all sample slots of the main thread
say how much of the wall clock the loop was working.

Prints the rate, the milliseconds a step, the share of each class and the
20 functions with the most samples of their own; the JSON keeps the
collapsed stacks. py-spy comes from PyPI (``pip install py-spy``); the run
refuses at once, naming it, when it is not on PATH or beside Python.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from tools.benchmark.lib import model_choice
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.report import write_json
from tools.benchmark.peers_client import complete
from tools.benchmark.peers_servers import Setup, cores, factory, start_timed
from tools.benchmark.peers_workload import prompt_ids, token_id_range

REPO = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 32
# (class, substrings): a sample's class is the first rule any of whose
# substrings is in its stack. Paths are vLLM 0.32's and ours.
RULES = (
    ("vllm-uma (ours)", ("vllm_uma/",)),
    ("model forward", ("model_executor/models/", "model_executor/layers/")),
    ("sampler", ("v1/sample/",)),
    ("input preparation", ("_prepare_inputs", "_update_states", "input_batch")),
    ("scheduler", ("core/sched/",)),
    ("outputs to the API server", ("process_output", "output_processor", "serial_utils")),
    ("model runner, other", ("model_runner",)),
    ("engine loop, other", ("engine/core.py",)),
)
OTHER = "other"


def find_py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def engine_core_pid(server_pid: int) -> int:
    """The engine core among the server's descendants: vLLM names it."""
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise RuntimeError(f"no EngineCore process under pid {server_pid}")


def classify(stack: str) -> str:
    for name, needles in RULES:
        if any(n in stack for n in needles):
            return name
    return OTHER


def summarize(collapsed: dict[str, int]) -> dict:
    """Shares by class and the functions with the most samples of their own
    (the stack's last frame) from py-spy's raw format (stack -> count)."""
    by_class: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, count in collapsed.items():
        by_class[classify(stack)] += count
        own[stack.rsplit(";", 1)[-1]] += count
    total = sum(by_class.values()) or 1
    return {
        "samples": sum(by_class.values()),
        "shares": {k: round(v / total, 4) for k, v in by_class.most_common()},
        "top_own": [[frame, count] for frame, count in own.most_common(20)],
    }


def read_raw(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[stack] = out.get(stack, 0) + int(count)
    return out


def decode(url: str, name: str, ids: list[int], tokens: int) -> dict:
    reply = complete(url, name, ids, tokens, ignore_eos=True)
    steps = (reply.completion_tokens or 0) - 1
    seconds = reply.end - (reply.first or reply.end)
    return {
        "tokens": reply.completion_tokens,
        "tok_s": round(steps / seconds, 2) if steps > 0 and seconds > 0 else None,
        "ms_per_step": round(1000 * seconds / steps, 2) if steps > 0 else None,
    }


def profile(args, py_spy: str) -> dict:
    choice = model_choice.choose(args.model)
    setup = Setup(
        choice.directory, choice.served_name,
        [*choice.serve_args, *args.serve_args.split()],
        Path(), Path(), args.context, cores(), args.dtype,
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="decode-profile-", dir=args.out.parent))
    log = args.out.with_suffix(".log")
    server, took = start_timed(factory("vllm-uma", setup, log, work))
    try:
        ids = token_id_range(choice.directory)
        warm, first, second = (prompt_ids(n, PROMPT_TOKENS, ids) for n in (1, 2, 3))
        complete(server.url, choice.served_name, warm, 8, ignore_eos=True)
        plain = decode(server.url, choice.served_name, first, args.tokens)
        raw = work / "profile.raw"
        spy = subprocess.Popen(
            [py_spy, "record", "--pid", str(engine_core_pid(server.proc.pid)), "--rate",
             str(args.rate), "--format", "raw", "--nonblocking", "--output", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)  # py-spy attaches before the request leaves
        sampled = decode(server.url, choice.served_name, second, args.tokens)
        spy.send_signal(2)  # SIGINT: py-spy writes what it has and exits
        _, err = spy.communicate(timeout=60)
        if not raw.is_file():
            raise RuntimeError(f"py-spy wrote no profile: {err.strip()[-400:]}")
        collapsed = read_raw(raw)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "model": choice.describe(args.dtype),
        "start_s": round(took, 1),
        "decode": plain,
        "decode_sampled": sampled,
        "profile": summarize(collapsed),
        "stacks": collapsed,
    }


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_choice.add_argument(ap)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--tokens", type=int, default=256, help="tokens each decode asks for")
    ap.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--serve-args", default="", help="more vllm-uma serve flags")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "decode_profile.json")
    args = ap.parse_args(argv)
    if args.tokens < 16 or args.rate < 1:
        ap.error(f"--tokens {args.tokens}, --rate {args.rate}: give tokens >= 16, rate >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    py_spy = find_py_spy()
    if py_spy is None:
        print("decode_profile: py-spy is not installed; pip install py-spy", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = environment(args)
    result = {"environment": env, **profile(args, py_spy)}
    write_json(args.out, result)
    plain, sampled, prof = result["decode"], result["decode_sampled"], result["profile"]
    print(f"{result['model']}; commit {env['git_commit']}, {env['cpu_model']}")
    print(
        f"decode, 1 request: {plain['tok_s']} tok/s ({plain['ms_per_step']} ms a step); "
        f"sampled by py-spy: {sampled['tok_s']} tok/s"
    )
    print(f"busy samples of the engine core: {prof['samples']}")
    for name, share in prof["shares"].items():
        print(f"  {share:6.1%}  {name}")
    print("functions with the most samples of their own:")
    for frame, count in prof["top_own"]:
        print(f"  {count:6d}  {frame}")
    print(f"wrote {args.out} (collapsed stacks included)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
