"""The cross-host benchmark's pure parts: its traffic, its flags, its figures."""

from __future__ import annotations

import pytest

from tools.benchmark.hosts_benchmark import (
    NETWORK_SOURCE,
    parse_args,
    restored_share,
    summarize,
    turn_prompt,
)


def test_each_turn_extends_the_one_before_and_conversations_differ():
    args = parse_args(["--out", "/tmp/x.json"])
    turns = [turn_prompt(args, 0, t) for t in range(1, args.turns + 1)]
    for earlier, later in zip(turns, turns[1:], strict=False):
        assert later.startswith(earlier + "\n")  # its KV is the next turn's prefix
    other = turn_prompt(args, 1, 1)
    assert other[:20] != turns[0][:20]  # no shared first block between conversations


@pytest.mark.parametrize(
    "flags",
    [
        ["--kill-after", "0"],
        ["--kill-after", "4", "--turns", "4"],  # nothing left for B
        ["--variants", "network,cloud"],
        ["--system-tokens", "8000"],  # the last turn overflows --max-model-len
    ],
)
def test_bad_flags_are_refused(flags):
    with pytest.raises(SystemExit):
        parse_args(["--out", "/tmp/x.json", *flags])


def test_the_figures_of_b_come_from_its_own_turns_and_counters():
    args = parse_args(["--out", "/tmp/x.json", "--turns", "4", "--kill-after", "2"])
    on_b = [
        {"conversation": c, "turn": t, "ttft_s": ttft, "prompt_tokens": 4000}
        for c, t, ttft in [(0, 3, 0.5), (1, 3, 0.7), (0, 4, 0.1), (1, 4, 0.2)]
    ]
    seen = {s: 0.0 for s in ("device", "host", "disk", NETWORK_SOURCE)}
    seen |= {"computed": 100.0, "network_read_bytes": 1.25e9, "network_read_s": 2.0}
    seen[NETWORK_SOURCE] = 7000.0
    fig = summarize(args, [], on_b, seen)
    assert fig["b_first_turn_ttft_p50_s"] == 0.6  # turn 3 only: the first on B
    assert fig["b_ttft_p50_s"] == 0.35
    assert fig["b_hit_tokens"][NETWORK_SOURCE] == 7000
    assert fig["b_network_read_gbit_s"] == 5.0  # 1.25 GB in 2 s
    assert (
        summarize(args, [], on_b, seen | {"network_read_s": 0.0})["b_network_read_gbit_s"] is None
    )


def test_the_restored_share_counts_a_full_blocks_of_a_last_prompts():
    seen = {s: 0.0 for s in ("device", "host", "disk", NETWORK_SOURCE)}
    seen[NETWORK_SOURCE] = 2 * 3296.0  # two conversations, every full block of each
    # A's last prompts: 3,300 tokens each, 103 full blocks of 32 (3,296 tokens).
    assert restored_share(seen, [3300, 3300], 32) == 1.0
    assert restored_share(seen | {NETWORK_SOURCE: 3296.0}, [3300, 3300], 32) == 0.5
    assert restored_share(seen, [], 32) is None


@pytest.mark.parametrize("death", ["kill", "cut"])
def test_the_death_and_the_router_are_flags(death):
    args = parse_args(["--out", "/tmp/x.json", "--death", death, "--no-router"])
    assert args.death == death and args.router is False
    assert parse_args(["--out", "/tmp/x.json"]).router is True
    with pytest.raises(SystemExit):
        parse_args(["--out", "/tmp/x.json", "--death", "poison"])
