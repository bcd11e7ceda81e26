"""vLLM CPU's recommended runtime (tcmalloc, Intel's OpenMP), measured.

    .venv/bin/python -m tools.benchmark.runtime_preload [--model zoo-qwen3-real] [--rounds 2]

vLLM warns at every start that neither libtcmalloc nor libiomp5 is in
LD_PRELOAD. This measures whether preloading them pays here: for each
variant a fresh compiled `vllm-uma serve` (one shared compile cache, warmed
first, so no variant pays a compile) with that LD_PRELOAD, and
- prefill: TTFT of a cold prompt of --prompt-tokens tokens (max_tokens=1),
  median of 3 distinct prompts;
- hit: the same prompt again (an L1 prefix hit), median;
- decode: tokens per second of 128 tokens after a short prompt, from
  (latency(129 tokens) - latency(1 token)) / 128, median of 3.
Variants run interleaved, --rounds times (plain, tcmalloc, iomp, both, plain,
...), and each is reported as a ratio to the plain server of its own round:
the machine is shared, and ratios within a round are what hold.

`vllm-uma serve` preloads what VLLM_UMA_PRELOAD names (nothing by default:
vllm_uma/commands/runtime_preload.py); every variant here sets it to its own list.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.benchmark.lib import model_choice, servers
from tools.benchmark.lib.environment import environment
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.prompts import text
from vllm_uma.commands import runtime_preload

DECODE_TOKENS = 128


def timed(server, name: str, payload: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    reply = server.post("/v1/completions", {"model": name, "temperature": 0, **payload})
    return time.perf_counter() - start, reply


def measure(server, name: str, args, seed: int) -> dict[str, float]:
    cold, hit, decode = [], [], []
    for r in range(3):
        prompt = text(seed * 10 + r, args.prompt_tokens)
        cold.append(timed(server, name, {"prompt": prompt, "max_tokens": 1})[0])
        hit.append(timed(server, name, {"prompt": prompt, "max_tokens": 1})[0])
        short = f"Variant {seed}, round {r}: tell a story. A"
        one, _ = timed(server, name, {"prompt": short, "max_tokens": 1})
        many, reply = timed(
            server, name, {"prompt": short, "max_tokens": DECODE_TOKENS + 1, "ignore_eos": True}
        )
        assert reply["usage"]["completion_tokens"] == DECODE_TOKENS + 1
        decode.append(DECODE_TOKENS / (many - one))
    return {
        "prefill_s": statistics.median(cold),
        "hit_s": statistics.median(hit),
        "decode_tok_s": statistics.median(decode),
    }


def variants() -> dict[str, str]:
    """Variant name -> VLLM_UMA_PRELOAD (a list of library names, or "none")."""
    found = runtime_preload.find_libraries()
    out = {"plain": "none"}
    if "tcmalloc" in found:
        out["tcmalloc"] = "tcmalloc"
    if "iomp" in found:
        out["iomp"] = "iomp"
    if len(found) == 2:
        out["tcmalloc+iomp"] = "tcmalloc,iomp"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_choice.add_argument(ap)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--max-model-len", type=int, default=4096)
    args = ap.parse_args()
    env = environment(args)
    choice = model_choice.choose(args.model)
    flags = [*choice.serve_args, "--max-model-len", str(args.max_model_len)]
    chosen = variants()
    missing = {"tcmalloc", "iomp"} - set(chosen)
    if missing:
        print(
            f"not found here, not measured: {', '.join(sorted(missing))} ({runtime_preload.WHERE})",
            file=sys.stderr,
        )
    rows = []
    with tempfile.TemporaryDirectory(prefix="runtime-preload-") as tmp:
        cache = {**servers.OFFLINE, "VLLM_CACHE_ROOT": str(Path(tmp) / "cache")}
        progress("warming the compile cache ...")
        servers.start(flags, Path(tmp) / "warm.log", env=cache, timeout=1800).stop()
        for r in range(args.rounds):
            for i, (name, preload) in enumerate(chosen.items()):
                progress(f"round {r + 1}: {name} ...")
                log = Path(tmp) / f"{name}-{r}.log"
                server = servers.start(
                    flags, log, env={**cache, runtime_preload.ENV: preload}, timeout=1800
                )
                try:
                    row = measure(server, choice.served_name, args, seed=r * 100 + i)
                finally:
                    server.stop()
                warned = "For best performance" in log.read_text()
                rows.append({"round": r, "variant": name, "vllm_warns": warned, **row})
    report(choice, args, env, rows)
    return 0


def report(choice, args, env, rows) -> None:
    print(
        f"{choice.describe()}, compiled, {args.prompt_tokens}-token prompts, medians of 3; "
        f"commit {env['git_commit']}, {env['cpu_model']}, load before "
        f"{env['loadavg_before'][0]:.1f}"
    )
    print(
        f"{'round':>5} {'variant':14} {'prefill':>8} {'hit':>7} {'decode':>12}  "
        f"{'prefill':>8} {'hit':>6} {'decode':>7}  (ratios to plain, same round)"
    )
    for row in rows:
        plain = next(p for p in rows if p["round"] == row["round"] and p["variant"] == "plain")
        print(
            f"{row['round'] + 1:5} {row['variant']:14} {row['prefill_s']:7.2f}s "
            f"{row['hit_s'] * 1000:5.0f}ms {row['decode_tok_s']:7.1f} tok/s  "
            f"{row['prefill_s'] / plain['prefill_s']:7.2f}x {row['hit_s'] / plain['hit_s']:5.2f}x "
            f"{row['decode_tok_s'] / plain['decode_tok_s']:6.2f}x"
            + ("" if row["variant"] == "plain" or not row["vllm_warns"] else "  (vLLM still warns)")
        )


if __name__ == "__main__":
    sys.exit(main())
