"""Where a restore's time goes: one prefix as an L1 hit, a pool restore and a
disk restore, each split into its parts.

    .venv/bin/python -m tools.benchmark.restore_breakdown [--prompt-tokens 4000]
        [--rounds 3] [--model zoo-qwen3-real] [--signed] [--network]
        [--block-size 128] [--out bench-out/restore_breakdown.json]

One server (eager, an L1 of about two prompts and a half, a pool of eight
prompts and at least 2 GiB, both in the model's KV bytes (lib/model_choice.py),
a disk tier in a temporary directory on the project's disk), at the block
size users run: vllm-uma's default (32 tokens, plugin/block_size.py), or
``--block-size N`` to compare another (128 is vLLM CPU's own). The L1 and
pool are sized in bytes, the same at every block size; the block size each
server runs and its KV bytes per block are checked against its breakdown
line (lib/model_choice.py). A prefix hit and a restore recompute the
partial last block: up to 31 tokens of a prompt at 32, up to 127 at 128.

Each round: prompt P cold (recompute), P again (L1 hit), three other
prompts (P leaves L1), P again (restored from the pool). Then the server
stops, the block files are dropped from the page cache and a new server on
the same disk tier serves every round's P (restored from the disk). With ``--network``, both
servers also have the network tier on a Valkey server on loopback
(tools/harness/valkey_server.py; the disk tier first, so the restarted
server still restores from disk), and a third server with the network
tier alone and no disk serves every round's P (restored from the KV server);
``--signed`` signs and checks its values too, else it runs with
``"unsigned": true``. One request at a time,
max_tokens 1, streamed, each after ``--settle`` seconds without a request
(default 3): the server's warm reserve (docs/memory.md) refills in about a
second after a restore, so each request finds it as a request after a pause
would; ``--settle 0`` measures back-to-back requests instead.

Per request, from the client and from the server's own /metrics (the
difference across the request, one request in flight so nothing else is
counted):
  tokenize    POST /tokenize of the same prompt (the API server's share)
  queue       vllm:request_queue_time_seconds: waiting to be scheduled,
              which includes waiting for a restore's KV to arrive
  load_time   vLLM's vllm:kv_offload_load_time (and load_bytes): the loads
              into L1 the request waited for, as vLLM counts them
  prefill     vllm:request_prefill_time_seconds: the forward of the
              uncached tail (and of everything, cold)
  server      vllm:time_to_first_token_seconds, arrival to first token
  client      streamed TTFT; client - server = HTTP, detokenize, the
              first token out
Medians over the rounds, printed as a table and written as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.benchmark.lib import client, model_choice, servers
from tools.benchmark.lib.floors import drop_page_cache
from tools.benchmark.lib.prompts import MODEL, text
from tools.benchmark.lib.report import Column, Table, write_json
from tools.harness.server import Server, metric
from tools.harness.valkey_server import KvServer
from vllm_uma.kv_offload import mac_keys
from vllm_uma.plugin import precision
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 8192
COMMON = ["--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN)]
L1_PROMPTS = 2.4  # P and one other stay; three others push P out
POOL_PROMPTS = 8  # P and the three others stay, with room
NETWORK_SOURCE = "external_unspecified"
HISTOGRAMS = {
    "queue": "vllm:request_queue_time_seconds_sum",
    "prefill": "vllm:request_prefill_time_seconds_sum",
    "server": "vllm:time_to_first_token_seconds_sum",
}


def transfers(body: str) -> dict[str, float]:
    """vLLM's offload load counters (time, bytes) as ``load_time``/``load_bytes``,
    with any label other than the engine's and the model's (vLLM 0.32 has none:
    one series for every load into L1)."""
    out: dict[str, float] = {}
    pattern = r"^vllm:kv_offload_(load_(?:time|bytes))(?:_total)?(?:\{([^}]*)\})? (\S+)$"
    for name, labels, value in re.findall(pattern, body, re.M):
        kept = [x for x in labels.split(",") if x and not x.startswith(("engine=", "model_name="))]
        key = name + (f"{{{','.join(kept)}}}" if kept else "")
        out[key] = out.get(key, 0.0) + float(value)
    return out


def measure(
    server: Server, prompt: str, model: str = MODEL, pause: float = 0.0
) -> dict[str, float]:
    url = server.url
    time.sleep(pause)
    start = time.perf_counter()
    server.post("/tokenize", {"model": model, "prompt": prompt}, timeout=60)
    tokenize = time.perf_counter() - start
    before = client.metrics(url, timeout=10)
    payload = {"model": model, "prompt": prompt, "max_tokens": 1}
    first = client.stream(url, payload, timeout=300).ttft_s
    time.sleep(0.5)  # the step's metrics reach the API server
    after = client.metrics(url, timeout=10)
    parts = {"tokenize": tokenize, "client": first}
    for key, name in HISTOGRAMS.items():
        parts[key] = metric(after, name) - metric(before, name)
    moved_before, moved_after = transfers(before), transfers(after)
    for key, value in moved_after.items():
        delta = value - moved_before.get(key, 0.0)
        if delta:
            parts[key] = delta
    hit_before, hit_after = client.cached_by_source(before), client.cached_by_source(after)
    for source, tokens in hit_after.items():
        parts[f"hit_{source}"] = tokens - hit_before[source]
    network = f'source="{NETWORK_SOURCE}"'  # vLLM's cache-hit source for our network tier
    found = metric(after, client.CACHED_BY_SOURCE, network)
    parts[f"hit_{NETWORK_SOURCE}"] = found - metric(before, client.CACHED_BY_SOURCE, network)
    return parts


def sizing(choice: model_choice.ModelChoice, prompt_tokens: int, dtype: str) -> list[str]:
    """L1 and pool flags in the model's KV bytes at ``dtype``."""
    per_prompt = choice.kv_bytes_per_token(dtype) * prompt_tokens
    pool_gib = max(2.0, POOL_PROMPTS * per_prompt / 2**30)
    l1 = int(L1_PROMPTS * per_prompt)
    return [
        *("--dtype", dtype, "--kv-cache-memory-bytes", str(l1)),
        *("--kv-offloading-size", f"{pool_gib:.2f}"),
    ]


def block_args(block_size: int | None) -> list[str]:
    """``--block-size`` when the run asks for one; else none: the servers
    run vllm-uma's default, as users do."""
    return [] if block_size is None else ["--block-size", str(block_size)]


def start(args: list[str], log_dir: Path, name: str, choice, dtype: str) -> Server:
    print(f"starting {name} ...", file=sys.stderr, flush=True)
    flags = choice.serve_args + COMMON + args
    server = servers.start(flags, log_dir / f"{name}.log")
    try:
        breakdown = servers.breakdown(server)
        model_choice.check_breakdown(choice, breakdown, servers.block_tokens(flags), dtype)
    except BaseException:
        server.stop()
        raise
    return server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds without a request before each measured one",
    )
    ap.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16" if precision.has_bf16_arithmetic() else "float32",
        help="the server's precision (default: what `vllm-uma serve` picks on this CPU, "
        "docs/serving.md Precision); the L1 and pool are sized in its KV bytes",
    )
    ap.add_argument(
        "--signed",
        action="store_true",
        help="the disk tier signs and checks every block file (a fresh secret_file), and "
        "the network tier every value: what the MAC adds to a restore",
    )
    ap.add_argument(
        "--network",
        action="store_true",
        help="a network tier on a loopback Valkey server too, and a restore from it",
    )
    ap.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="the servers' KV block in tokens (default: vllm-uma's, "
        f"{DEFAULT_BLOCK_TOKENS}); 128 is vLLM CPU's own, to compare",
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "restore_breakdown.json")
    model_choice.add_argument(ap)
    args = ap.parse_args()
    if L1_PROMPTS * args.prompt_tokens < MAX_MODEL_LEN:
        ap.error(
            f"--prompt-tokens {args.prompt_tokens}: the L1 is sized at {L1_PROMPTS} prompts, "
            f"{L1_PROMPTS * args.prompt_tokens:.0f} tokens, less than the server's "
            f"--max-model-len {MAX_MODEL_LEN}, which vLLM refuses; give at least "
            f"{int(MAX_MODEL_LEN / L1_PROMPTS) + 1}"
        )
    choice = model_choice.choose(args.model)
    print(f"model: {choice.describe(args.dtype)}", file=sys.stderr, flush=True)
    model = choice.served_name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cases: dict[str, list[dict]] = {"recompute": [], "l1_hit": [], "pool": [], "disk": []}
    with (
        tempfile.TemporaryDirectory(prefix="restore-breakdown-") as logs,
        tempfile.TemporaryDirectory(prefix="restore-breakdown-disk-", dir=REPO) as disk,
        contextlib.ExitStack() as stack,
    ):
        secret = Path(logs) / "kv.secret" if args.signed else None
        if secret is not None:
            mac_keys.generate_file(str(secret))
        disk_tier = {"type": "fs", "root_dir": str(Path(disk) / "kv"), "max_size_gib": 0}
        if secret is not None:
            disk_tier["secret_file"] = str(secret)
        network_tier = None
        if args.network:
            kv_server = KvServer(
                Path(logs), "--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"
            )
            stack.callback(kv_server.stop)
            network_tier = {"type": "valkey", "url": kv_server.url}
            network_tier |= {"secret_file": str(secret)} if secret else {"unsigned": True}
        sized = sizing(choice, args.prompt_tokens, args.dtype) + block_args(args.block_size)
        tier = sized + tiers_args([disk_tier, network_tier])
        prompts = [text(700 + r, args.prompt_tokens) for r in range(args.rounds)]
        server = start(tier, Path(logs), "first", choice, args.dtype)
        try:
            measure(server, "Hello", model)  # first-request set-up, unmeasured
            for r, prompt in enumerate(prompts):
                cases["recompute"].append(measure(server, prompt, model, args.settle))
                cases["l1_hit"].append(measure(server, prompt, model, args.settle))
                for k in range(3):  # P leaves L1 (about two prompts fit)
                    measure(server, text(900 + 10 * r + k, args.prompt_tokens), model)
                cases["pool"].append(measure(server, prompt, model, args.settle))
        finally:
            server.stop()  # a clean stop: every block file is written
        drop_page_cache(Path(disk))
        server = start(tier, Path(logs), "restarted", choice, args.dtype)
        try:
            measure(server, "Hello", model)
            cases["disk"] = [measure(server, prompt, model, args.settle) for prompt in prompts]
        finally:
            server.stop()
        if network_tier is not None:
            server = start(
                sized + tiers_args([network_tier]), Path(logs), "network", choice, args.dtype
            )
            try:
                measure(server, "Hello", model)
                cases["network"] = [measure(server, p, model, args.settle) for p in prompts]
            finally:
                server.stop()
    result = {case: _medians(runs) for case, runs in cases.items()}
    result["prompt_tokens"] = args.prompt_tokens
    result["model"] = choice.describe(args.dtype)
    result["rounds"] = args.rounds
    result["settle_s"] = args.settle
    result["signed"] = args.signed
    result["block_tokens"] = servers.block_tokens(choice.serve_args + COMMON + sized)
    write_json(args.out, result)
    signed = "signed" if args.signed else "unsigned"
    print(
        f"model: {result['model']}; {result['block_tokens']}-token KV blocks; block files "
        f"and network values {signed}"
    )
    print(_table(result))
    print(f"wrote {args.out}")
    return 0


def _medians(runs: list[dict]) -> dict[str, float]:
    keys = sorted({k for run in runs for k in run})
    return {k: statistics.median(run.get(k, 0.0) for run in runs) for k in keys}


def tiers_args(tiers: list[dict | None]) -> list[str]:
    """--kv-transfer-config with these secondary tiers (None: left out)."""
    config = {"kv_connector_extra_config": {"secondary_tiers": [t for t in tiers if t]}}
    return ["--kv-transfer-config", json.dumps(config)]


def _table(result: dict) -> str:
    cases = [c for c in ("recompute", "l1_hit", "pool", "disk", "network") if c in result]
    keys = ["tokenize", "queue", "prefill", "server", "client"]
    keys += sorted({k for c in cases for k in result[c] if k.startswith("load_")})
    keys += ["hit_device", "hit_host", "hit_disk"]
    keys += [f"hit_{NETWORK_SOURCE}"] if "network" in cases else []
    table = Table([Column("part", 44, left=True)] + [Column(c, 11, gap=0) for c in cases])
    lines = [table.header()]
    for key in keys:
        cells = []
        for case in cases:
            value = result[case].get(key, 0.0)
            if key.startswith(("hit_", "load_bytes")):
                cells.append(f"{value:.0f}")
            else:
                cells.append(f"{value * 1000:.1f}ms")
        lines.append(table.row([key[:44], *cells]))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
