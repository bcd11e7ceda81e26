"""Figures, checks and output of the KV offloading benchmark: one variant's
summary with its floor, the comparison with `off` that can mark the run
suspect, the console table and the PNG chart.
"""

from __future__ import annotations

from pathlib import Path

from tools.benchmark.kv_offload_client import PassResult
from tools.benchmark.kv_offload_rounds import paired_ratios
from tools.benchmark.lib.client import HIT_SOURCES
from tools.benchmark.lib.report import Column, Table, percentile

VARIANTS = ("off", "pool", "pool_disk")
CONTROLS = ("no_reuse", "reuse_fits")
# A control (no reuse, or reuse that fits L1) gives offloading nothing to
# restore: more than this ahead of `off` means the run measured something
# else (noise, a warmer server, a different L1).
SUSPECT_RATIO = 1.25
# In spill_revisit the revisited prefixes must have left L1; `off` finding
# more than this share of the measured prompt tokens in L1 means they did not.
SPILL_L1_HIT_LIMIT = 0.10


def summarize(
    result: PassResult, counters: dict[str, int], kv_per_token: float, bandwidth: dict
) -> dict:
    """One variant's figures. The floor is the restored bytes of one request
    over the bandwidth measured on this machine: host-pool hits at memory-copy
    speed, disk hits at disk-read speed. No restore can be faster."""
    n = len(result.replies)
    hits = {s: counters[f"hit_{s}"] for s in HIT_SOURCES}
    floor_total = hits["host"] * kv_per_token / (bandwidth["memcpy_gbps"] * 1e9)
    if hits["disk"]:
        floor_total += hits["disk"] * kv_per_token / (bandwidth["disk_read_gbps"] * 1e9)
    p50 = percentile(result.ttfts, 50)
    floor = floor_total / n
    return {
        "requests": n,
        "ttft_p50_s": round(p50, 4),
        "ttft_p99_s": round(percentile(result.ttfts, 99), 4),
        "ttft_mean_s": round(sum(result.ttfts) / n, 4),
        "throughput_tok_s": round(result.tokens / result.wall_s, 1),
        "wall_s": round(result.wall_s, 2),
        "prompt_tokens": sum(r.prompt_tokens for r in result.replies),
        "completion_tokens": sum(r.completion_tokens for r in result.replies),
        "hit_tokens": hits,
        "computed_tokens": counters["computed"],
        "offload_bytes": {
            "pool_to_l1": counters["bytes_CPU_to_GPU"],
            "l1_to_pool": counters["bytes_GPU_to_CPU"],
            "all": counters["bytes_all"],
        },
        "disk_written_bytes": counters.get("disk_written", 0),
        "restored_bytes": int((hits["host"] + hits["disk"]) * kv_per_token),
        "floor_restore_s_per_request": round(floor, 5),
        "ttft_p50_over_floor": round(p50 / floor, 1) if floor else None,
    }


def compare(workloads: dict[str, dict[str, dict]], equal_memory: bool) -> list[str]:
    """Add each variant's speedup over `off`; return the suspect reasons.
    With equal memory, `off` has the pool's bytes as extra L1, so the spill
    set may fit it: that is the point of the comparison, not a fault."""
    reasons = []
    for name, variants in workloads.items():
        off = variants.get("off")
        if not _ok(off):
            continue
        for variant, fig in variants.items():
            if variant == "off" or not _ok(fig):
                continue
            if "rounds" in off and "rounds" in fig:  # repeated: paired within rounds
                paired = paired_ratios(off, fig)
                if paired is None:
                    reasons.append(f"{name}/{variant}: every round failed or was noisy")
                    continue
                fig["vs_off"] = paired
                ttft_x, tput_x = paired["ttft_p50_x"], paired["throughput_x"]
            else:
                ttft_x = off["ttft_p50_s"] / fig["ttft_p50_s"]
                tput_x = fig["throughput_tok_s"] / off["throughput_tok_s"]
                fig["vs_off"] = {"ttft_p50_x": round(ttft_x, 2), "throughput_x": round(tput_x, 2)}
            if name in CONTROLS and max(ttft_x, tput_x) > SUSPECT_RATIO:
                reasons.append(
                    f"control {name}: {variant} is {ttft_x:.2f}x ahead of off in TTFT p50 "
                    f"and {tput_x:.2f}x in throughput (limit {SUSPECT_RATIO}x): a control "
                    f"has nothing to restore, so the difference is noise or setup"
                )
        if name == "spill_revisit" and not equal_memory:
            share = off["hit_tokens"]["device"] / off["prompt_tokens"]
            if share > SPILL_L1_HIT_LIMIT:
                reasons.append(
                    f"spill_revisit: off found {share:.0%} of the revisited prompt tokens in "
                    f"L1 (limit {SPILL_L1_HIT_LIMIT:.0%}): the prefixes did not overflow L1"
                )
    return reasons


def expectations(workloads: dict[str, dict[str, dict]], equal_memory: bool = False) -> list[str]:
    """Warnings: a lower tier that should have served the measured pass but
    did not. (At equal memory pool_disk's L1 is the budget less a staging
    pool, and holds the spill set: it is served from L1.)"""
    out = []
    spill_variants = ("pool",) if equal_memory else ("pool", "pool_disk")
    for name, tier, variants in (
        ("spill_revisit", "host", spill_variants),
        ("restart", "disk", ("pool_disk",)),
    ):
        for variant in variants:
            fig = workloads.get(name, {}).get(variant)
            if _ok(fig) and fig["hit_tokens"]["host"] + fig["hit_tokens"]["disk"] == 0:
                out.append(f"{name}/{variant}: no prompt token came from the {tier} tier")
    return out


def busy(workloads: dict[str, dict[str, dict]], load_before: float, cores: int) -> list[str]:
    """Warnings: other work competed for the cores (our server alone keeps
    about ``cores`` busy), so the figures are slower and noisier than idle."""
    out = []
    if load_before > cores / 2:
        out.append(f"the machine was busy before the run: load {load_before:.1f} on {cores} cores")
    loaded = [
        f"{name}/{variant} ({fig['loadavg_1m']:.1f})"
        for name, variants in workloads.items()
        for variant, fig in variants.items()
        if fig.get("loadavg_1m", 0) > cores + 1.5
    ]
    if loaded:
        out.append(
            f"1-minute load above {cores + 1.5:g} at the end of: {', '.join(loaded)}; "
            f"other processes shared the cores, compare ratios rather than seconds"
        )
    return out


def _ok(fig: dict | None) -> bool:
    return fig is not None and "error" not in fig


# The console table: one row per workload and variant.
TABLE = Table(
    [
        Column("workload", 14, left=True),
        Column("variant", 9, left=True),
        Column("TTFT p50", 9, "{:.3f}s"),
        Column("p99", 8, "{:.3f}s"),
        Column("tok/s", 7, "{:.0f}"),
        Column("hit L1", 7, "{:d}"),
        Column("hit pool", 8, "{:d}"),
        Column("hit disk", 8, "{:d}"),
        Column("floor/req", 9, "{:.4f}s"),
        Column("p50/floor", 9, "{:.0f}x"),
        Column("vs off", 7, "{:.2f}x"),
        Column("range", 11, "{0[0]:.2f}-{0[1]:.2f}x"),
        Column("tok/s vs off", 12, "{:.2f}x"),
        Column("range", 11, "{0[0]:.2f}-{0[1]:.2f}x"),
    ]
)


def table(workloads: dict[str, dict[str, dict]]) -> str:
    head = TABLE.header()
    lines = [head, "-" * len(head)]
    for name, variants in workloads.items():
        for variant in VARIANTS:
            fig = variants.get(variant)
            if fig is None:
                continue
            if "error" in fig:
                lines.append(f"{name:14} {variant:9} FAILED: {fig['error'].splitlines()[0][:120]}")
                continue
            hits, vs = fig["hit_tokens"], fig.get("vs_off", {})
            lines.append(
                TABLE.row(
                    [
                        name,
                        variant,
                        fig["ttft_p50_s"],
                        fig["ttft_p99_s"],
                        fig["throughput_tok_s"],
                        hits["device"],
                        hits["host"],
                        hits["disk"],
                        fig["floor_restore_s_per_request"],
                        fig["ttft_p50_over_floor"],
                        vs.get("ttft_p50_x"),
                        vs.get("ttft_p50_x_range"),
                        vs.get("throughput_x"),
                        vs.get("throughput_x_range"),
                    ]
                )
            )
    return "\n".join(lines)


def chart(workloads: dict[str, dict[str, dict]], path: Path, title: str) -> None:
    """TTFT p50 (p99 as a whisker) and throughput per workload and variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(workloads)
    fig, (ax_ttft, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(VARIANTS)
    drawn = 0
    for i, variant in enumerate(VARIANTS):
        xs, p50, p99, tput = [], [], [], []
        for x, name in enumerate(names):
            v = workloads[name].get(variant)
            if _ok(v):
                xs.append(x + (i - 1) * width)
                p50.append(v["ttft_p50_s"])
                p99.append(v["ttft_p99_s"] - v["ttft_p50_s"])
                tput.append(v["throughput_tok_s"])
        ax_ttft.bar(xs, p50, width, yerr=[[0] * len(p99), p99], capsize=3, label=variant)
        ax_tput.bar(xs, tput, width, label=variant)
        drawn += len(xs)
    for ax, label in ((ax_ttft, "TTFT p50, s (whisker: p99)"), (ax_tput, "throughput, tokens/s")):
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    if drawn:
        ax_ttft.set_yscale("log")
    else:
        fig.text(0.5, 0.5, "no variant completed: see the JSON's errors", ha="center")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
