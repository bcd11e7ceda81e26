"""What `memory_pressure` reports: its figures, verdicts and PNG.

The figures come from the two servers' runs, the verdict lines hold them
against the targets, the PNG draws the samples.
"""

from __future__ import annotations

from pathlib import Path

from tools.benchmark.lib.report import GiB, gib


def figures(feature: dict, reference: dict) -> dict:
    idle = feature["idle_kv_resident_bytes"]
    under = feature.get("kv_resident_under_hog_bytes")
    return {
        "kv_resident_after_burst_bytes": feature["kv_resident_after_burst_bytes"],
        "live_kv_bytes": feature["live_kv_bytes"],
        "idle_kv_resident_bytes": idle,
        "kv_resident_under_hog_bytes": under,
        "given_back_fraction": None if under is None or not idle else round(1 - under / idle, 3),
        "seconds_to_give_back": feature.get("seconds_to_give_back"),
        "oom_kills": feature["oom_kills"] + reference["oom_kills"],
        "revisit_hit_tokens": feature["revisit_hit_tokens"],
        "revisit_recomputed_tokens": feature["revisit_recomputed_tokens"],
        "outputs_identical": feature["revisit_outputs"] == reference["revisit_outputs"],
        "reference_kv_resident_after_burst_bytes": reference["kv_resident_after_burst_bytes"],
        "reference_revisit_hit_tokens": reference["revisit_hit_tokens"],
    }


def verdicts(p: dict) -> list[str]:
    g = gib
    live = p["live_kv_bytes"] or 0
    frac, secs = p["given_back_fraction"], p["seconds_to_give_back"]
    hits = p["revisit_hit_tokens"]
    return [
        f"after the burst: resident KV {g(p['kv_resident_after_burst_bytes'])} GiB <= live "
        f"{g(live)} GiB + 10%: "
        + ("HELD" if p["kv_resident_after_burst_bytes"] <= live * 1.1 else "MISSED")
        + f" (without the feature: {g(p['reference_kv_resident_after_burst_bytes'])} GiB)",
        f"with the hog: gave back {frac} of idle KV {g(p['idle_kv_resident_bytes'])} GiB "
        f"(target >= 0.8) in {secs} s (target <= 10): "
        + (
            "HELD"
            if frac is not None and frac >= 0.8 and secs is not None and secs <= 10
            else "MISSED"
        ),
        f"OOM kills: {p['oom_kills']} (target 0)",
        f"revisits: hit tokens {hits} (device/host/disk), recomputed "
        f"{p['revisit_recomputed_tokens']}; outputs identical to the reference: "
        f"{p['outputs_identical']}",
    ]


def draw(samples: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.stackplot(
        t,
        [s["l1"] / GiB for s in samples],
        [s["pool"] / GiB for s in samples],
        labels=["KV cache (L1) resident", "host pool (L2) resident"],
    )
    ax.plot(t, [s["rss"] / GiB for s in samples], "r:", label="engine core RSS")
    ax.plot(t, [s["available"] / GiB for s in samples], "k--", label="MemAvailable")
    top = ax.get_ylim()[1]
    for i, cur in enumerate(samples):
        if i == 0 or cur["phase"] != samples[i - 1]["phase"]:
            ax.axvline(cur["t"], color="grey", lw=0.8)
            ax.text(cur["t"], top * (0.97 - 0.04 * (i % 2)), " " + cur["phase"], fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_ylabel("GiB")
    ax.set_title("vllm-uma: resident KV memory through burst, idle, hog and revisit")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
