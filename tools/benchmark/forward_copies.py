"""Does the model's forward pay for streaming copies? Prefill and decode with and without.

    .venv/bin/python -m tools.benchmark.forward_copies [--model zoo-qwen3-real] [--rounds 2]

With KV offloading on, the engine core runs with glibc's non-temporal
threshold at 192 KiB (vllm_uma/kv_offload/streaming_copies.py), so every
copy larger than that in the forward streams to RAM too, where it
used to stay in the cache. This measures the forward alone: servers
without offloading (so nothing sets the tunable), started alternately with
and without ``GLIBC_TUNABLES`` set to that value, ``--rounds`` of each.
On each: two cold 4,000-token prompts (prefill time from the server's
/metrics; the faster kept) and one 64-token decode after a 500-token prompt
(tokens per second between the first and the last token). Eager, as the
other real-size benchmarks. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.benchmark.lib import client, model_choice, servers
from tools.benchmark.lib.copies_env import copies_environment
from tools.benchmark.lib.prompts import text
from tools.harness.server import metric

PREFILL = "vllm:request_prefill_time_seconds_sum"
PROMPT_TOKENS = 4000
DECODE_TOKENS = 64
SEED = 7000


def measure(url: str, model: str, seed: int) -> tuple[float, float]:
    """(prefill seconds of a cold prompt, the faster of two; decode tokens/s)."""
    prefills = []
    for i in range(2):
        before = client.metrics(url)
        payload = {"model": model, "prompt": text(seed + i, PROMPT_TOKENS), "max_tokens": 1}
        client.stream(url, payload, timeout=300)
        time.sleep(0.5)  # the step's metrics reach the API server
        prefills.append(metric(client.metrics(url), PREFILL) - metric(before, PREFILL))
    payload = {
        "model": model,
        "prompt": text(seed + 2, 500),
        "max_tokens": DECODE_TOKENS,
        "ignore_eos": True,
    }
    streamed = client.stream(url, payload, timeout=300)
    decode = (DECODE_TOKENS - 1) / (streamed.latency_s - streamed.ttft_s)
    return min(prefills), decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_choice.add_argument(ap)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    choice = model_choice.choose(args.model)
    print(f"model: {choice.describe()}", flush=True)
    results: dict[str, list[tuple[float, float]]] = {"cached": [], "streamed": []}
    seed = SEED
    with tempfile.TemporaryDirectory(prefix="forward-copies-") as logs:
        for rnd in range(args.rounds):
            for name in ("cached", "streamed"):
                print(f"round {rnd + 1}: starting a server, copies {name} ...", file=sys.stderr)
                server = servers.start(
                    [*choice.serve_args, "--enforce-eager", "--max-model-len", "8192"],
                    Path(logs) / f"{name}-{rnd}.log",
                    env=copies_environment(name == "streamed"),
                )
                try:
                    seed += 10
                    prefill, decode = measure(server.url, choice.served_name, seed)
                finally:
                    server.stop()
                results[name].append((prefill, decode))
                print(
                    f"round {rnd + 1} {name:8} prefill {prefill:.3f} s  decode {decode:.2f} tok/s"
                )
    for name, runs in results.items():
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        print(f"median   {name:8} prefill {prefill:.3f} s  decode {decode:.2f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
