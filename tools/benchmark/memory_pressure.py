"""KV memory that follows the working set: the release benchmark.

    .venv/bin/python -m tools.benchmark.memory_pressure [--out bench-out/memory_pressure.json]
        [--model zoo-qwen3-real]

(also run as `memory_benchmark --pressure`, the Makefile's bench-memory-pressure).

Phases on one `vllm-uma serve` (``--model``: the default model, a model zoo
build or a directory, lib/model_choice.py; utilization 0.5, a host pool and
a disk tier; the release settings as given, idle release after
``--idle-seconds``):

  burst    distinct prompts, ``--burst-tokens`` in all (max_tokens 8; by
           default as many tokens as hold BURST_KV_BYTES of the model's KV,
           100,000 of the default model's);
  idle     no request for idle-seconds + 10 s: the idle release runs;
  hog      a helper process allocates and touches MemAvailable minus
           ``--hog-leave-gib``, holds it ``--hog-seconds``, then exits;
  revisit  the first ``--revisit`` prompts again (max_tokens 8).

The same phases run first on a reference server with the feature off
(``release_free_kv`` false, ``memory_pressure`` off), without the hog: its
revisits are L1 hits of the same prompts, the fair reference for the
feature's restores (same prefix split, bf16).

Resident KV is the kernel's count of the pages of the KV cache's mapping
and of the host pool's (smaps Rss; vllm_uma/memory_release/resident.py),
with the engine core's RSS beside it. Sampled every 0.5 s, drawn in a PNG
beside the JSON. Live KV is what the server
says it keeps (its last "KV kept:" log line). OOM kills: /proc/vmstat's
oom_kill before and after. Hit tokens by tier: the deltas of
vllm:prompt_tokens_cached_by_source_total over the revisits.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import psutil

from tools.benchmark.lib import client, model_choice, servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.model_choice import ModelChoice
from tools.benchmark.lib.prompts import prompt_ids
from tools.benchmark.lib.report import GiB
from tools.benchmark.memory_common import finish, prepared, ram_holder, say, send_prompts, server
from tools.benchmark.memory_pressure_report import draw, figures, verdicts
from tools.benchmark.memory_pressure_sampler import Sampler, oom_kills, seconds_to_give_back
from tools.harness.server import model_process
from vllm_uma.server_process import Server

KEPT_RE = re.compile(r"KV memory: .* KV kept: ([\d.]+) GiB")
FEATURE_OFF = {"release_free_kv": False, "memory_pressure": "off"}
# The default burst in KV bytes, not tokens: 100,000 tokens of the default
# model's 23,040 B (about 2.15 GiB). The L1 (utilization 0.5), the 4 GiB pool,
# the 16 GiB disk tier and the hog are all bytes of RAM or disk, so a model
# with more KV per token gets fewer tokens and the same share of each.
BURST_KV_BYTES = 2_304_000_000


def burst_tokens(args, kv_bytes_per_token: int) -> int:
    """``--burst-tokens``, or BURST_KV_BYTES in the model's tokens. Refused
    if the burst has fewer prompts than ``--revisit`` revisits: a revisit
    of a prompt never sent would be a cold prefill, not a restore."""
    given = args.burst_tokens is not None
    tokens = args.burst_tokens if given else BURST_KV_BYTES // kv_bytes_per_token
    prompts = -(-tokens // args.prompt_tokens)
    if prompts < args.revisit:
        what = "--burst-tokens" if given else "the default burst for this model"
        raise SystemExit(
            f"--revisit {args.revisit}: {what} is {tokens:,} tokens, {prompts} prompts of "
            f"{args.prompt_tokens:,}, and only sent prompts can be revisited. Set --revisit "
            f"{prompts} or less, or --burst-tokens {args.revisit * args.prompt_tokens:,} or more"
        )
    return tokens


def pressure_server(name: str, choice: ModelChoice, args, out_dir: Path, uma: dict) -> Server:
    """The plugin server at 0.5, with a pool, a fresh disk tier and ``uma``."""
    disk = out_dir / f"pressure-disk-{name}"
    shutil.rmtree(disk, ignore_errors=True)  # revisits must not find an earlier run's blocks
    extra = ["--kv-offloading-size", str(args.pool_gib)]
    extra += servers.disk_tier_args(disk, 16)
    extra += ["--additional-config", json.dumps({"vllm_uma": uma})]
    return server("plugin", choice, 0.5, out_dir / f"pressure-{name}.log", tuple(extra))


def one_server(name: str, choice: ModelChoice, args, out_dir: Path, uma: dict, hog: bool) -> dict:
    srv = pressure_server(name, choice, args, out_dir, uma)
    result: dict = {"server": name, "command": srv.proc.args, "log": str(srv.log_path)}
    say(f"pressure/{name}: starting on port {srv.port} (log {srv.log_path})")
    with servers.running(srv):
        if not servers.ready(srv, args.ready_timeout):
            raise RuntimeError(f"{name} server exited before ready; see {srv.log_path}")
        breakdown = servers.breakdown(srv)
        block = servers.block_tokens(list(srv.proc.args))  # its command line's
        model_choice.check_breakdown(choice, breakdown, block)
        result["breakdown"] = breakdown
        sampler = Sampler(model_process(srv.proc.pid).pid, breakdown, breakdown["per_block_bytes"])
        sampler.start()
        try:
            phases(name, choice.served_name, args, srv, sampler, result, hog)
        finally:
            sampler.stop()
        result["samples"] = sampler.samples
    return result


def phases(
    name: str, model: str, args, srv: Server, sampler: Sampler, result: dict, hog: bool
) -> None:
    count = -(-args.burst_tokens // args.prompt_tokens)
    sampler.phase = "burst"
    say(f"pressure/{name}: burst of {count} prompts x {args.prompt_tokens} tokens")
    # One at a time: each prompt's KV is then computed in the same chunks on
    # both servers, so the reference's L1 hits are a fair oracle for the
    # feature's restores in bfloat16 (two in flight split prompts by timing:
    # seen differing in one revisit of eight at Qwen3-0.6B's size).
    result["burst_tokens"] = send_prompts(srv, model, 0, count, args.prompt_tokens, 1)
    sampler.phase = "idle"
    time.sleep(args.idle_seconds + 10)
    idle = sampler.sample()
    kept = KEPT_RE.findall(srv.log())
    result["kv_resident_after_burst_bytes"] = idle["kv"]
    result["idle_kv_resident_bytes"] = idle["kv"]
    result["live_kv_bytes"] = int(float(kept[-1]) * GiB) if kept else None
    oom_before = oom_kills()
    if hog:
        hog_phase(args, sampler, result)
    result["oom_kills"] = oom_kills() - oom_before
    result["server_alive"] = srv.proc.poll() is None
    sampler.phase = "revisit"
    revisit(srv, model, args, result)


def hog_phase(args, sampler: Sampler, result: dict) -> None:
    """MemAvailable minus --hog-leave-gib taken by a helper for --hog-seconds."""
    sampler.phase = "hog"
    start = len(sampler.samples)
    want = int(psutil.virtual_memory().available - args.hog_leave_gib * GiB)
    say(f"hog: allocating {want / GiB:.2f} GiB, holding {args.hog_seconds:.0f} s")
    hog_proc = ram_holder(want, args.hog_seconds)
    held = hog_proc.stdout.readline().strip() == "held"
    time.sleep(max(0.0, args.hog_seconds - 2))  # near the end of the hold
    under = sampler.sample()
    hog_proc.wait()
    result["hog_held"] = held
    result["kv_resident_under_hog_bytes"] = under["kv"]
    result["seconds_to_give_back"] = seconds_to_give_back(
        sampler.samples[start:], result["idle_kv_resident_bytes"]
    )
    sampler.phase = "after hog"
    time.sleep(5)


def revisit(srv: Server, model: str, args, result: dict) -> None:
    """The first --revisit prompts again: which tier served them, and their tokens."""
    before = client.cached_by_source(client.metrics(srv.url))
    outputs, prompt_tokens = [], 0
    for i in range(args.revisit):
        payload = {"model": model, "prompt": prompt_ids(i, args.prompt_tokens), "max_tokens": 8}
        reply = srv.post("/v1/completions", {**payload, "temperature": 0, "logprobs": 0}, 600)
        outputs.append(reply["choices"][0]["logprobs"]["tokens"])
        prompt_tokens += reply["usage"]["prompt_tokens"]
    after = client.cached_by_source(client.metrics(srv.url))
    hits = {k: int(after[k] - before[k]) for k in ("device", "host", "disk")}
    result["revisit_outputs"] = outputs
    result["revisit_hit_tokens"] = hits
    result["revisit_recomputed_tokens"] = prompt_tokens - sum(hits.values())


def run(args, choice: ModelChoice, out_dir: Path) -> tuple[dict, list[str]]:
    """Both servers' phases; the figures the issue lists, and the verdict lines."""
    reference = one_server("reference", choice, args, out_dir, FEATURE_OFF, hog=False)
    uma = {"release_idle_seconds": args.idle_seconds, "memory_pressure": "psi"}
    feature = one_server("feature", choice, args, out_dir, uma, hog=True)
    result = figures(feature, reference)
    png = out_dir / "memory_pressure.png"
    draw(feature["samples"], png)
    result["png"] = str(png)
    result["servers"] = {"feature": feature, "reference": reference}
    return result, verdicts(result)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=2000, help="tokens per prompt")
    p.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for /health")
    p.add_argument(
        "--burst-tokens",
        type=int,
        default=None,
        help="burst size (default: about 2.15 GiB of the model's KV; 100,000 tokens of the "
        "default model's)",
    )
    p.add_argument("--idle-seconds", type=int, default=20, help="release_idle_seconds")
    p.add_argument("--pool-gib", type=float, default=4, help="--kv-offloading-size")
    p.add_argument("--hog-leave-gib", type=float, default=0.5, help="RAM the hog leaves")
    p.add_argument("--hog-seconds", type=float, default=20, help="how long it holds")
    p.add_argument("--revisit", type=int, default=8, help="first prompts revisited")
    p.add_argument("--out", type=Path, default=Path("bench-out/memory_pressure.json"))
    model_choice.add_argument(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    choice = prepared(args.out, args.model)
    if choice is None:
        return 2
    args.burst_tokens = burst_tokens(args, choice.kv_bytes_per_token())
    result = {"environment": environment(args), "model": choice.describe()}
    result["pressure"], lines = run(args, choice, args.out.parent)
    lines = [f"model: {result['model']}", *lines]
    return finish(args.out, result, lines, f"{args.out} and {result['pressure']['png']}")


if __name__ == "__main__":
    sys.exit(main())
