"""Eager vs compiled (torch.compile) on this machine: what `vllm-uma serve`
should default to, measured in one run.

    .venv/bin/python -m tools.benchmark.eager_vs_compiled [--prompt-tokens 1928] [--rounds 3]

For each mode, a fresh server of the default model (bf16), one request at a
time, as a user's first requests would be:
- start-up: from launch to /health answering; compiled twice, first with an
  empty vLLM compile cache (a new machine), then with the cache it left;
- prefill: a cold prompt of --prompt-tokens tokens (max_tokens=1), median of
  --rounds distinct prompts;
- L1 hit: the same prompt again (max_tokens=1), median;
- decode: 128 tokens after a short prompt (ignore_eos), tokens per second
  from (latency(129 tokens) - latency(1 token)) / 128, median;
- correctness: the README example's answer, and greedy tokens of four chat
  prompts against transformers bf16 up to the first near-tie
  (vllm_uma/models/oracles.py).
Ratios within the run are what to compare: the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.benchmark.lib import servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.prompts import MODEL, text
from tools.harness.reference import TransformersReference
from vllm_uma import models
from vllm_uma.models import smollm2
from vllm_uma.server_process import Server

CHAT_PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain in one sentence what a CPU cache is.",
    "Give me a short tip for learning to cook.",
]
MAX_TOKENS = 24
DECODE_TOKENS = 128


def timed(server: Server, payload: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    reply = server.post("/v1/completions", {"model": MODEL, "temperature": 0, **payload})
    return time.perf_counter() - start, reply


def chat(server: Server, question: str, max_tokens: int) -> tuple[list[int], list[int], str]:
    reply = server.chat(MODEL, question, max_tokens, return_token_ids=True)
    choice = reply["choices"][0]
    return reply["prompt_token_ids"], choice["token_ids"], choice["message"]["content"]


def measure(
    name: str, flags: list[str], env: dict, log_dir: Path, args, reference
) -> dict[str, object]:
    print(f"starting {name} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    server = servers.start(flags, log_dir / f"{name}.log", env=env, timeout=900)
    row: dict[str, object] = {"mode": name, "startup_s": time.perf_counter() - started}
    try:
        cold, hit, decode = [], [], []
        for r in range(args.rounds):
            prompt = text(500 + r, args.prompt_tokens)
            cold.append(timed(server, {"prompt": prompt, "max_tokens": 1})[0])
            hit.append(timed(server, {"prompt": prompt, "max_tokens": 1})[0])
            short = f"Round {r} of {name}: tell a story."
            one, _ = timed(server, {"prompt": short + " A", "max_tokens": 1})
            many, reply = timed(
                server,
                {"prompt": short + " A", "max_tokens": DECODE_TOKENS + 1, "ignore_eos": True},
            )
            assert reply["usage"]["completion_tokens"] == DECODE_TOKENS + 1
            decode.append(DECODE_TOKENS / (many - one))
        row.update(
            prefill_s=statistics.median(cold),
            l1_hit_s=statistics.median(hit),
            decode_tok_s=statistics.median(decode),
        )
        _, _, answer = chat(server, smollm2.CHECK_PROMPT, MAX_TOKENS)
        row["readme_answer"] = answer
        verdicts = []
        for question in CHAT_PROMPTS:
            prompt_ids, served, _ = chat(server, question, MAX_TOKENS)
            verdicts.append(reference.judge(prompt_ids, served, MAX_TOKENS))
        row["agree"] = sum(bool(v) for v in verdicts)
        row["agree_detail"] = [v.detail for v in verdicts]
    finally:
        server.stop()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=1928)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = environment(args)  # before the servers: the load then says how idle it was
    model_dir = models.prepare()
    reference = TransformersReference(model_dir, "bfloat16")
    rows = []
    with tempfile.TemporaryDirectory(prefix="eager-vs-compiled-") as tmp:
        log_dir = Path(tmp)
        # An empty compile cache of our own: the first compiled start is a
        # new machine's, the second reuses what the first wrote.
        cache = {"VLLM_CACHE_ROOT": str(log_dir / "vllm-cache")}
        modes = [
            ("eager", ["--enforce-eager"]),
            ("compiled, cache empty", ["--no-enforce-eager"]),
            ("compiled, cache warm", ["--no-enforce-eager"]),
        ]
        for name, flags in modes:
            rows.append(measure(name, flags, cache, log_dir, args, reference))
    print(
        f"{args.prompt_tokens}-token prompts, {args.rounds} rounds, medians; "
        f"bf16, one request at a time; commit {env['git_commit']}, {env['cpu_model']}, "
        f"load before {env['loadavg_before'][0]:.1f}"
    )
    header = f"{'mode':24} {'start-up':>9} {'prefill':>8} {'L1 hit':>8} {'decode':>10}  correctness"
    print(header)
    for row in rows:
        print(
            f"{row['mode']:24} {row['startup_s']:8.0f}s {row['prefill_s']:7.2f}s "
            f"{row['l1_hit_s'] * 1000:6.0f}ms {row['decode_tok_s']:6.1f} tok/s  "
            f"README answer {row['readme_answer']!r}; "
            f"{row['agree']}/{len(CHAT_PROMPTS)} chats agree with transformers"
        )
    for row in rows:
        for detail in row["agree_detail"]:
            print(f"  {row['mode']}: {detail}")
    eager, warm = rows[0], rows[2]
    print(
        f"compiled/eager: prefill {warm['prefill_s'] / eager['prefill_s']:.2f}x, "
        f"L1 hit {warm['l1_hit_s'] / eager['l1_hit_s']:.2f}x, "
        f"decode {warm['decode_tok_s'] / eager['decode_tok_s']:.2f}x tokens/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
