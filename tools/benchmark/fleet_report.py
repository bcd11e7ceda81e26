"""What the fleet benchmark reports: one policy's figures, the console table, the PNG.

The figures come from one fleet's run (fleet_benchmark.py): the TTFT of
every turn, the cached share of each later turn's prompt, the servers'
/metrics totals and the router's KV lookups. Runs in the benchmark's process.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from tools.benchmark.lib.client import HIT_SOURCES
from tools.benchmark.lib.report import Column, Table, at_rank


def figures(
    ttfts: dict[int, list[float]],
    later: list[dict],
    totals: list[dict[str, float]],
    lookups: dict[str, float],
    turns: int,
) -> dict:
    """One policy's figures: ``ttfts`` by turn, ``later`` the usage of each
    later turn, ``totals`` each server's /metrics counts, ``lookups`` the
    router's KV index hits and misses."""
    hits = {tier: sum(t[tier] for t in totals) for tier in HIT_SOURCES}
    all_ttft = sorted(x for v in ttfts.values() for x in v)
    later_ttft = sorted(x for t, v in ttfts.items() if t > 0 for x in v)
    found = [u["cached_tokens"] / u["prompt_tokens"] for u in later if u]
    return {
        "ttft_p50_s": statistics.median(all_ttft),
        "ttft_p99_s": at_rank(all_ttft, 0.99),
        "ttft_p50_later_turns_s": statistics.median(later_ttft) if later_ttft else None,
        # Share of each later turn's prompt its server found cached, in any
        # tier: without a disk tier only the conversation's server has it.
        "later_turns_cached_share": round(statistics.mean(found), 3) if found else None,
        "later_turns_mostly_cached": sum(f >= 0.5 for f in found),
        "later_turns": len(found),
        "ttft_p50_by_turn_s": [statistics.median(ttfts[t]) for t in range(turns)],
        "hit_tokens": hits,
        "recomputed_tokens": sum(t["prompt"] for t in totals) - sum(hits.values()),
        "requests_per_server": [t["requests"] for t in totals],
        "router_kv_lookups": lookups,
    }


POLICY_TABLE = Table(
    [
        Column("policy", 12, left=True),
        Column("TTFT p50", 9, "{:.3f}s"),
        Column("p99", 7, "{:.3f}s"),
        Column("later p50", 9, "{:.3f}s"),
        Column("device", 7, "{:.0f}"),
        Column("host", 6, "{:.0f}"),
        Column("disk", 6, "{:.0f}"),
        Column("recomp", 7, "{:.0f}"),
        # later turns mostly cached / later turns, and the mean share cached
        Column("later cached", 12, "{0[0]:>5}/{0[1]:<2} {0[2]:>4.0%}"),
        Column("router hit/miss", 15, "{0[0]:>7.0f}/{0[1]:<7.0f}"),
        Column("requests/server", 0, left=True, gap=2),
    ]
)


def print_table(key: str, policies: dict, settings: tuple) -> None:
    disk = key == "policies" and True in settings
    print(f"\n{'with the shared disk store' if disk else 'without a disk tier'}")
    print(POLICY_TABLE.header())
    for name, r in policies.items():
        h, look = r["hit_tokens"], r["router_kv_lookups"]
        cached = (r["later_turns_mostly_cached"], r["later_turns"], r["later_turns_cached_share"])
        print(
            POLICY_TABLE.row(
                [
                    name,
                    r["ttft_p50_s"],
                    r["ttft_p99_s"],
                    r["ttft_p50_later_turns_s"],
                    h["device"],
                    h["host"],
                    h["disk"],
                    r["recomputed_tokens"],
                    cached,
                    (look["hit"], look["miss"]),
                    str(r["requests_per_server"]),
                ]
            )
        )


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(p, r) for p, r in result.get("policies", {}).items()]
    runs += [(f"{p}\nno disk", r) for p, r in result.get("policies_without_disk", {}).items()]
    labels = [label for label, _ in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    bottom = [0.0] * len(runs)
    for tier in HIT_SOURCES:
        values = [r["hit_tokens"][tier] for _, r in runs]
        left.bar(labels, values, bottom=bottom, label=f"from {tier}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.bar(labels, [r["recomputed_tokens"] for _, r in runs], bottom=bottom,
             label="recomputed", color="lightgrey")  # fmt: skip
    left.set_ylabel("prompt tokens")
    left.tick_params(axis="x", labelsize=8)
    left.legend()
    width = 0.38
    xs = range(len(runs))
    right.bar([x - width / 2 for x in xs], [r["ttft_p50_s"] for _, r in runs], width,
              label="all turns")  # fmt: skip
    right.bar([x + width / 2 for x in xs], [r["ttft_p50_later_turns_s"] for _, r in runs],
              width, label="later turns")  # fmt: skip
    right.set_xticks(list(xs), labels, fontsize=8)
    right.set_ylabel("TTFT p50 (s)")
    right.legend()
    fig.suptitle(result["traffic"])
    fig.tight_layout()
    fig.savefig(path)
