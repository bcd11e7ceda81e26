"""The fleet-death benchmark's pure parts: its traffic, its flags, its figures."""

from __future__ import annotations

import pytest

from tools.benchmark.fleet_death import (
    Turn,
    conversation_turn,
    parse_args,
    round_figures,
)
from tools.benchmark.lib.servers import block_tokens


def test_each_turn_extends_the_conversation_so_far_and_the_reference_differs():
    args = parse_args(["--out", "/tmp/x.json"])
    replies = [" Yes, it is.", " No."]
    turns = [conversation_turn(6000, t, replies, args) for t in (1, 2, 3)]
    for t, (earlier, later) in enumerate(zip(turns, turns[1:], strict=False)):
        # The next turn's prefix is this turn and its reply: the KV the
        # killed server computed.
        assert later.startswith(earlier + replies[t] + "\nUser:")
    reference = conversation_turn(9000, 3, replies, args)
    assert reference[:30] != turns[2][:30]  # no shared first block
    assert abs(len(reference) - len(turns[2])) < 0.05 * len(turns[2])  # the same shape


@pytest.mark.parametrize(
    "flags",
    [
        ["--kill-delays", "a,b"],
        ["--kill-delays", "-1"],
        ["--kill-delays", ""],
        ["--rounds", "0"],
        ["--turns-before", "0"],
    ],
)
def test_bad_flags_are_refused(flags):
    with pytest.raises(SystemExit):
        parse_args(["--out", "/tmp/x.json", *flags])


def test_block_size_is_read_from_the_serve_flags():
    assert block_tokens(["--enforce-eager"]) == 32
    assert block_tokens(["--block-size", "128"]) == 128
    assert block_tokens(["--block-size=64", "--enforce-eager"]) == 64


def test_figures_count_the_full_blocks_the_killed_server_computed():
    nxt = Turn(0.5, prompt_tokens=3560, cached_tokens=3296, completion_tokens=32, text="")
    ref = Turn(2.5, prompt_tokens=3561, cached_tokens=0, completion_tokens=32, text="")
    seen = {"device": 0, "host": 0, "disk": 2976, "prompt": 3560}
    fig = round_figures(0.5, 3300 + 32, nxt, ref, seen, 32)  # a prompt and its reply
    assert fig["conversation_full_block_tokens"] == 3328  # (3300 + 32) // 32 * 32
    assert fig["restored_tokens"] == 2976
    assert fig["restored_share"] == round(2976 / 3328, 3)
    assert fig["ttft_ratio"] == 0.2
    # More found than the killed server computed (the reply's tail block
    # re-tokenised the same): the share is capped at all of it.
    more = round_figures(0, 3300 + 32, nxt, ref, seen | {"disk": 3360}, 32)
    assert more["restored_share"] == 1.0
