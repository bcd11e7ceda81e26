"""The phases of `memory_benchmark.py --pressure`, its figures and its PNG.

See memory_pressure.py for what is measured and how.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psutil

from tools.benchmark import memory_benchmark as mb
from tools.benchmark import memory_pressure as mp
from tools.harness.server import free_port, model_process
from vllm_uma.plugin.memory import BREAKDOWN_PREFIX, parse_breakdown

FEATURE_OFF = {"release_free_kv": False, "memory_pressure": "off"}


def server(port: int, disk: Path, pool_gib: float, uma: dict) -> tuple[list[str], dict]:
    """memory_benchmark's plugin server at 0.5, with a pool, a disk tier and ``uma``."""
    cmd, env = mb.server_command("plugin", port, 0.5)
    tier = {"type": "fs", "root_dir": str(disk), "max_size_gib": 16}
    cmd += [
        "--kv-offloading-size",
        str(pool_gib),
        "--kv-transfer-config",
        json.dumps({"kv_connector_extra_config": {"secondary_tiers": [tier]}}),
        "--additional-config",
        json.dumps({"vllm_uma": uma}),
    ]
    return cmd, env


def one_server(name: str, args, out_dir: Path, uma: dict, hog: bool) -> dict:
    port, disk = free_port(), out_dir / f"pressure-disk-{name}"
    shutil.rmtree(disk, ignore_errors=True)  # revisits must not find an earlier run's blocks
    cmd, env = server(port, disk, args.pool_gib, uma)
    log_path = out_dir / f"pressure-{name}.log"
    result: dict = {"server": name, "command": cmd, "log": str(log_path)}
    mb.say(f"pressure/{name}: starting on port {port} (log {log_path})")
    with mb.started(cmd, env, log_path) as proc:
        if not mb.wait_ready(proc, port, args.ready_timeout):
            raise RuntimeError(f"{name} server exited before ready; see {log_path}")
        line = next(x for x in log_path.read_text().splitlines() if BREAKDOWN_PREFIX in x)
        breakdown = parse_breakdown(line)
        result["breakdown"] = breakdown
        sampler = mp.Sampler(model_process(proc.pid).pid, breakdown, breakdown["per_block_bytes"])
        sampler.start()
        try:
            phases(name, args, port, proc, sampler, log_path, result, hog)
        finally:
            sampler.stop()
        result["samples"] = sampler.samples
    return result


def phases(name, args, port, proc, sampler, log_path, result, hog: bool) -> None:
    count = -(-args.burst_tokens // args.prompt_tokens)
    sampler.phase = "burst"
    mb.say(f"pressure/{name}: burst of {count} prompts x {args.prompt_tokens} tokens")
    result["burst_tokens"] = mb.send_prompts(port, 0, count, args.prompt_tokens, 2)
    sampler.phase = "idle"
    mb.time.sleep(args.idle_seconds + 10)
    idle = sampler.sample()
    kept = mp.KEPT_RE.findall(log_path.read_text())
    result["kv_resident_after_burst_bytes"] = idle["kv"]
    result["idle_kv_resident_bytes"] = idle["kv"]
    result["live_kv_bytes"] = int(float(kept[-1]) * mp.GiB) if kept else None
    oom_before = mp.oom_kills()
    if hog:
        sampler.phase = "hog"
        start = len(sampler.samples)
        hog_proc = mp.run_hog(args.hog_leave_gib, args.hog_seconds, mb.say)
        held = hog_proc.stdout.readline().strip() == "held"
        mb.time.sleep(max(0.0, args.hog_seconds - 2))  # near the end of the hold
        under = sampler.sample()
        hog_proc.wait()
        result["hog_held"] = held
        result["kv_resident_under_hog_bytes"] = under["kv"]
        result["seconds_to_give_back"] = seconds_to_give_back(
            sampler.samples[start:], result["idle_kv_resident_bytes"]
        )
        sampler.phase = "after hog"
        mb.time.sleep(5)
    result["oom_kills"] = mp.oom_kills() - oom_before
    result["server_alive"] = proc.poll() is None
    sampler.phase = "revisit"
    before = mp.cached_by_source(port)
    outputs, prompt_tokens = [], 0
    for i in range(args.revisit):
        tokens, used = mp.complete(port, mb.MODEL_NAME, mb.prompt_ids(i, args.prompt_tokens))
        outputs.append(tokens)
        prompt_tokens += used
    after = mp.cached_by_source(port)
    hits = {k: int(after.get(k, 0) - before.get(k, 0)) for k in ("device", "host", "disk")}
    result["revisit_outputs"] = outputs
    result["revisit_hit_tokens"] = hits
    result["revisit_recomputed_tokens"] = prompt_tokens - sum(hits.values())


def seconds_to_give_back(samples: list[dict], idle: int) -> float | None:
    """From pressure onset to resident KV at or under 20% of the idle figure;
    None if it never got there.

    Onset: the first sample at which either signal the server acts on says
    pressure, read here on their own: MemAvailable under 10% of RAM, or some
    task stalled on memory 10% or more of the time since the previous
    sample (PSI's cumulative total)."""
    low = psutil.virtual_memory().total * 0.10
    onset = None
    for prev, cur in zip(samples, samples[1:], strict=False):
        stalled = None
        if prev["psi_some_us"] is not None and cur["psi_some_us"] is not None:
            elapsed_us = (cur["t"] - prev["t"]) * 1e6
            stalled = (cur["psi_some_us"] - prev["psi_some_us"]) / elapsed_us if elapsed_us else 0
        if cur["available"] < low or (stalled is not None and stalled >= 0.10):
            onset = cur["t"]
            break
    if onset is None:
        return None
    done = next((s["t"] for s in samples if s["t"] >= onset and s["kv"] <= idle * 0.2), None)
    return None if done is None else round(done - onset, 2)


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
    g = mb.gib
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


def run(args, out_dir: Path) -> tuple[dict, list[str]]:
    """Both servers' phases; the figures the issue lists, and the verdict lines."""
    reference = one_server("reference", args, out_dir, FEATURE_OFF, hog=False)
    uma = {"release_idle_seconds": args.idle_seconds, "memory_pressure": "psi"}
    feature = one_server("feature", args, out_dir, uma, hog=True)
    result = figures(feature, reference)
    png = out_dir / "memory_pressure.png"
    draw(feature["samples"], png)
    result["png"] = str(png)
    result["servers"] = {"feature": feature, "reference": reference}
    return result, verdicts(result)


def draw(samples: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.stackplot(
        t,
        [s["l1"] / mp.GiB for s in samples],
        [s["pool"] / mp.GiB for s in samples],
        labels=["KV cache (L1) resident", "host pool (L2) resident"],
    )
    ax.plot(t, [s["rss"] / mp.GiB for s in samples], "r:", label="engine core RSS")
    ax.plot(t, [s["available"] / mp.GiB for s in samples], "k--", label="MemAvailable")
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
