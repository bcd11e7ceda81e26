"""Rounds of the KV offloading benchmark: rotated order, the noise probe's
verdict, merged figures and ratios paired within rounds, noisy rounds left
out of the median."""

from __future__ import annotations

import pytest

from tools.benchmark.kv_offload_report import compare, table
from tools.benchmark.kv_offload_rounds import (
    machine_probe,
    merge_rounds,
    paired_ratios,
    probe_change,
    rotate,
)


def run(p50: float, tput: float, noisy: str | None = None) -> dict:
    fig = {
        "ttft_p50_s": p50, "ttft_p99_s": p50 * 2, "throughput_tok_s": tput,
        "hit_tokens": {"device": 0, "host": 0, "disk": 0}, "prompt_tokens": 100,
        "floor_restore_s_per_request": 0.0, "ttft_p50_over_floor": None,
    }  # fmt: skip
    if noisy:
        fig["noisy"] = noisy
    return fig


def test_each_round_rotates_the_order_so_no_variant_is_always_first():
    variants = ["off", "pool", "pool_disk"]
    orders = [rotate(variants, r) for r in range(3)]
    assert [o[0] for o in orders] == ["off", "pool", "pool_disk"]
    assert all(sorted(o) == sorted(variants) for o in orders)


def test_a_probe_that_moved_more_than_half_names_what_moved():
    before = {"memcpy_gbps": 14.0, "compute_s": 0.10}
    assert probe_change(before, {"memcpy_gbps": 9.0, "compute_s": 0.14}) is None
    assert "memcpy_gbps 14 -> 6" in probe_change(before, {"memcpy_gbps": 6.0, "compute_s": 0.1})
    assert "compute_s" in probe_change(before, {"memcpy_gbps": 14.0, "compute_s": 0.2})
    probe = machine_probe()  # the real probe measures something
    assert probe["memcpy_gbps"] > 0.1 and probe["compute_s"] > 0


def test_merged_figures_are_the_median_round_and_keep_every_round():
    merged = merge_rounds([run(3.0, 100), run(1.0, 300), run(2.0, 200)])
    assert merged["ttft_p50_s"] == 2.0 and merged["throughput_tok_s"] == 200
    assert merged["ttft_p50_range_s"] == [1.0, 3.0]
    assert [r["ttft_p50_s"] for r in merged["rounds"]] == [3.0, 1.0, 2.0]


def test_ratios_pair_runs_of_the_same_round_and_skip_noisy_ones():
    off = merge_rounds([run(2.0, 100), run(4.0, 50), run(2.0, 100)])
    pool = merge_rounds([run(2.0, 100), run(2.0, 100), run(1.0, 200, noisy="memcpy moved")])
    paired = paired_ratios(off, pool)
    # round 2: off was slow (4 s) and pool 2 s: a real 2x within the round;
    # round 3 is noisy and left out.
    assert paired["rounds_used"] == 2 and paired["rounds"] == 3
    assert paired["ttft_p50_x_range"] == [1.0, 2.0]
    assert paired["ttft_p50_x"] == pytest.approx(1.5)
    assert paired_ratios(off, merge_rounds([run(1.0, 1, noisy="x")] * 3)) is None


def test_compare_uses_paired_rounds_and_the_table_shows_the_range():
    off = merge_rounds([run(2.0, 100), run(2.2, 95), run(2.1, 98)])
    pool = merge_rounds([run(2.1, 96), run(2.2, 95), run(2.0, 101)])
    workloads = {"no_reuse": {"off": off, "pool": pool}}
    assert compare(workloads, equal_memory=False) == []
    vs = pool["vs_off"]
    assert vs["rounds_used"] == 3 and vs["throughput_x_range"][0] < 1 < vs["throughput_x_range"][1]
    assert "0.95-1.05x" in table(workloads)
    all_noisy = merge_rounds([run(2.0, 100, noisy="x")] * 3)
    reasons = compare({"no_reuse": {"off": off, "pool": all_noisy}}, equal_memory=False)
    assert reasons == ["no_reuse/pool: every round failed or was noisy"]
