"""Repeated, interleaved variant runs, a noise probe around each, and ratios
with their spread: how the KV offloading benchmark sees through a noisy host.

The host is shared: its memory bandwidth and compute speed drift in bursts
longer than one variant's run (measured: numpy memcpy 14 GB/s, minutes
later 8-9.6). Running every `off` and then every `pool` turns such a burst
into a "cost" of one variant. So a workload runs in rounds; each round runs
every variant once, in an order rotated from round to round (no variant
always first), and a ratio is taken *within* a round, between runs minutes
apart. The ratios of all rounds give a median and a range. Around every run
a probe (a memory copy and a fixed single-core Python loop, about a second)
measures the machine; a run whose probe moved by more than PROBE_TOLERANCE
between before and after is marked noisy, and its rounds' ratios are left
out of the median (but kept in the JSON). On this host, idle, the probe
itself moves from second to second (Python loop 0.055-0.099 s, memcpy
13-17.5 GB/s, eight probes in a row): the tolerance only catches a machine
that changed by more than that, and the rounds' range shows the rest.
"""

from __future__ import annotations

import statistics

from tools.benchmark.lib.floors import best_of, memcpy_gbps

PROBE_TOLERANCE = 0.5  # a probe moving more than this: the machine changed
PROBE_BYTES = 256 << 20


def rotate(variants: list[str], round_index: int) -> list[str]:
    """Round r's order: the variants rotated by r."""
    k = round_index % len(variants)
    return variants[k:] + variants[:k]


def machine_probe() -> dict[str, float]:
    """Memory copy bandwidth (GB/s, best of five) and a fixed single-core
    Python loop's time (s, best of three; the engine's scheduler is Python
    too): what a variant's run depends on, measured in about a second."""

    def loop() -> None:
        total = 0
        for i in range(1_500_000):
            total += i * i

    return {
        "memcpy_gbps": round(memcpy_gbps(PROBE_BYTES, repeats=5), 2),
        "compute_s": round(best_of(3, loop), 4),
    }


def probe_change(before: dict[str, float], after: dict[str, float]) -> str | None:
    """Why the machine changed under a run, or None."""
    for key, unit in (("memcpy_gbps", "GB/s"), ("compute_s", "s")):
        b, a = before[key], after[key]
        if b > 0 and abs(a - b) / b > PROBE_TOLERANCE:
            return f"{key} {b:.3g} -> {a:.3g} {unit} during the run"
    return None


def merge_rounds(runs: list[dict]) -> dict:
    """One variant's figure from its rounds: the median round's figures (by
    TTFT p50) with, beside them, every round's headline and the range."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {**runs[0], "rounds": [_headline(r) for r in runs]}
    middle = sorted(ok, key=lambda r: r["ttft_p50_s"])[(len(ok) - 1) // 2]
    merged = {**middle}
    merged["ttft_p50_s"] = round(statistics.median(r["ttft_p50_s"] for r in ok), 4)
    merged["throughput_tok_s"] = round(statistics.median(r["throughput_tok_s"] for r in ok), 1)
    p50s = [r["ttft_p50_s"] for r in ok]
    merged["ttft_p50_range_s"] = [min(p50s), max(p50s)]
    merged["rounds"] = [_headline(r) for r in runs]
    return merged


def paired_ratios(off: dict, variant: dict) -> dict | None:
    """The variant against `off`, round by round (both runs of a round are
    minutes apart), over the rounds where neither run failed or was noisy.
    ``ttft_p50_x`` > 1: the variant answers sooner; ``throughput_x`` > 1:
    it serves more tokens per second."""
    pairs = [
        (o, v)
        for o, v in zip(off["rounds"], variant["rounds"], strict=False)
        if not (o.get("error") or v.get("error") or o.get("noisy") or v.get("noisy"))
    ]
    if not pairs:
        return None
    ttft = [o["ttft_p50_s"] / v["ttft_p50_s"] for o, v in pairs]
    tput = [v["throughput_tok_s"] / o["throughput_tok_s"] for o, v in pairs]
    return {
        "ttft_p50_x": round(statistics.median(ttft), 3),
        "ttft_p50_x_range": [round(min(ttft), 3), round(max(ttft), 3)],
        "throughput_x": round(statistics.median(tput), 3),
        "throughput_x_range": [round(min(tput), 3), round(max(tput), 3)],
        "rounds_used": len(pairs),
        "rounds": len(variant["rounds"]),
    }


def _headline(run: dict) -> dict:
    if "error" in run:
        return {"error": run["error"].splitlines()[0]}
    out = {k: run[k] for k in ("ttft_p50_s", "throughput_tok_s") if k in run}
    out.update({k: run[k] for k in ("probe", "noisy", "order") if run.get(k) is not None})
    return out
