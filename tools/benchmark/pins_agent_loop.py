"""An agent loop's time to first token with its system prompt pinned, and without.

    .venv/bin/python -m tools.benchmark.pins_agent_loop [--system-tokens 8000]
        [--turns 5] [--dtype float32] [--out bench-out/pins_agent_loop.json]

One `vllm-uma serve` of the default model (compiled, as users run it; the
default block size) with a host pool and a disk tier in a temporary
directory on the project's disk. Two agents share it, each with a system
prompt of ``--system-tokens`` (distinct from the first token): agent P's is
pinned (POST /v1/uma/pins, which also prefills it: the warm-up), agent U's
is not. The pool and the disk cap are each 2.2 times one system prompt, so
pins (pin_share 0.5) fit and the rest of each tier holds a little more than
U's prompt.

Each turn: eviction traffic (other prompts, 1.3 system prompts' worth of
KV: enough to cycle the unpinned room of the pool and of the disk), then
P's system prompt and a short user turn, then U's with the same turn, one
request at a time, streamed, max_tokens 1. Per request: the client's TTFT
and where its prompt's tokens came from (vLLM's cached-by-source counter,
diffed around the request: L1, host pool, disk; the rest recomputed).

The floor each is compared against: the cold prefill of a system prompt
(U's first request, before any traffic), and P's warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from tools.benchmark.lib import client, servers
from tools.benchmark.lib.prompts import MODEL, text
from tools.benchmark.lib.report import Column, Table, write_json
from vllm_uma.plugin import precision
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64, per token, at 2 bytes.
KV_PER_TOKEN_BF16 = 23_040
TIER_SCALE = 2.2  # the pool and the disk cap, in system prompts
TRAFFIC_SCALE = 1.3  # eviction traffic a turn, in system prompts
TRAFFIC_TOKENS = 2_000  # one traffic request
MAX_MODEL_LEN = 8192  # the default model's own limit


def kv_per_token(dtype: str) -> int:
    return KV_PER_TOKEN_BF16 * (2 if dtype == "float32" else 1)


def server_args(root: Path, system_tokens: int, dtype: str) -> list[str]:
    system_bytes = system_tokens * kv_per_token(dtype)
    tier_gib = TIER_SCALE * system_bytes / (1 << 30)
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": round(tier_gib, 4)}
    return [
        "--dtype",
        dtype,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        # L1: one system prompt and a turn; traffic pushes it out.
        "--kv-cache-memory-bytes",
        str(int(1.15 * MAX_MODEL_LEN * kv_per_token(dtype))),
        "--kv-offloading-size",
        f"{tier_gib:.4f}",
        "--kv-transfer-config",
        json.dumps({"kv_connector_extra_config": {"secondary_tiers": [tier]}}),
    ]


def timed(url: str, prompt: str) -> dict:
    """One streamed request: TTFT and where its prompt tokens came from."""
    before = client.cached_by_source(client.metrics(url))
    reply = client.stream(
        url,
        {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0,
         "stream_options": {"include_usage": True}},
        timeout=600,
    )  # fmt: skip
    after = client.cached_by_source(client.metrics(url))
    prompt_tokens = (reply.usage or {}).get("prompt_tokens", 0)
    sources = {s: int(after[s] - before[s]) for s in client.HIT_SOURCES}
    return {
        "ttft_s": reply.ttft_s,
        "prompt_tokens": prompt_tokens,
        **sources,
        "recomputed": prompt_tokens - sum(sources.values()),
    }


def turn_text(turn: int) -> str:
    return f" User turn {turn}: which tool do you call next, and why?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system-tokens", type=int, default=8000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16" if precision.has_bf16_arithmetic() else "float32",
        help="the server's precision (default: what `vllm-uma serve` picks on this CPU)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "pins_agent_loop.json")
    args = ap.parse_args()
    if not 2 * DEFAULT_BLOCK_TOKENS <= args.system_tokens <= MAX_MODEL_LEN - 64:
        ap.error(f"--system-tokens {args.system_tokens}: from 64 to {MAX_MODEL_LEN - 64}")
    pinned_prompt = text(1, args.system_tokens)
    free_prompt = text(2, args.system_tokens)
    traffic_per_turn = max(1, round(TRAFFIC_SCALE * args.system_tokens / TRAFFIC_TOKENS))
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory(prefix="pins-agent-loop-") as logs,
        tempfile.TemporaryDirectory(prefix="pins-agent-loop-disk-", dir=REPO) as disk,
    ):
        flags = server_args(Path(disk) / "kv", args.system_tokens, args.dtype)
        print("starting the server ...", file=sys.stderr, flush=True)
        with servers.running(servers.start(flags, Path(logs) / "server.log")) as server:
            url = server.url
            cold = timed(url, free_prompt + turn_text(0))
            started = time.perf_counter()
            made = requests.post(
                f"{url}/v1/uma/pins",
                json={"name": "agent-p", "prompt": pinned_prompt, "ttl_s": 3600},
                timeout=600,
            )
            made.raise_for_status()
            warm_s = time.perf_counter() - started
            pin = made.json()
            print(
                f"pinned agent-p: {pin['tokens']} tokens, {pin['blocks']} blocks, "
                f"in {warm_s:.2f} s; "
                f"{traffic_per_turn} traffic requests of {TRAFFIC_TOKENS} tokens a turn",
                file=sys.stderr,
                flush=True,
            )
            for turn in range(1, args.turns + 1):
                for j in range(traffic_per_turn):
                    timed(url, text(1000 + turn * 100 + j, TRAFFIC_TOKENS))
                rows.append({"turn": turn, "agent": "pinned",
                             **timed(url, pinned_prompt + turn_text(turn))})  # fmt: skip
                rows.append({"turn": turn, "agent": "unpinned",
                             **timed(url, free_prompt + turn_text(turn))})  # fmt: skip
    table = Table(
        [
            Column("turn", 4),
            Column("agent", 9, left=True),
            Column("TTFT ms", 8, "{:.0f}", unit=1e-3),
            Column("L1", 6),
            Column("pool", 6),
            Column("disk", 6),
            Column("recomputed", 10),
        ]
    )
    print(
        f"\nagent loop, system prompt {args.system_tokens} tokens, {args.dtype}, "
        f"{traffic_per_turn * TRAFFIC_TOKENS} tokens of traffic between turns"
    )
    print(table.header())
    for row in rows:
        print(
            table.row(
                [row["turn"], row["agent"], row["ttft_s"], row["device"], row["host"],
                 row["disk"], row["recomputed"]]
            )
        )  # fmt: skip
    medians = {
        agent: statistics.median(r["ttft_s"] for r in rows if r["agent"] == agent)
        for agent in ("pinned", "unpinned")
    }
    print(
        f"\nmedian TTFT: pinned {medians['pinned'] * 1e3:.0f} ms, unpinned "
        f"{medians['unpinned'] * 1e3:.0f} ms ({medians['unpinned'] / medians['pinned']:.1f}x)"
    )
    print(
        f"floors: a cold system prompt (prefill) {cold['ttft_s'] * 1e3:.0f} ms; "
        f"the pin's warm-up {warm_s * 1e3:.0f} ms"
    )
    write_json(
        args.out,
        {
            "system_tokens": args.system_tokens,
            "dtype": args.dtype,
            "traffic_tokens_per_turn": traffic_per_turn * TRAFFIC_TOKENS,
            "cold": cold,
            "warm_up_s": warm_s,
            "pin": pin,
            "turns": rows,
            "median_ttft_s": medians,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
