"""The pool-share sweep's arithmetic: every server one budget, traffic sized from it."""

from __future__ import annotations

import pytest

from tools.benchmark import pool_split

ROW = 737_280  # the default model's KV block at vllm-uma's default, 32 tokens
ROW_128 = 2_949_120  # at vLLM CPU's 128


def args(*argv):
    return pool_split.parse_args(list(argv))


def test_every_point_has_the_same_budget_and_off_has_it_all():
    a = args("--pool-blocks", "128,640", "--tiers", "pool_disk,pool")
    assert a.row_bytes == ROW and a.pool_blocks == [128, 640] and a.budget_blocks == 1996
    for n in a.pool_blocks:
        s = pool_split.settings_for(a, n)
        runner = pool_split.SweepRunner(s, a.out.parent, {})
        budget = 1996 * ROW + ROW // 2
        assert runner.l1_bytes("off") == budget
        assert runner.l1_bytes("pool_disk") == budget - n * ROW
        assert runner.l1_bytes("pool") == budget - n * ROW
        disk = runner.server_args("pool_disk", a.out.parent / "d")
        assert disk[disk.index("--kv-offloading-size") + 1] == f"{n * ROW / 2**30:g}"


def test_the_defaults_are_the_same_bytes_at_every_block_size():
    """Budget and pools default to tokens of KV: the servers' blocks (from
    --server-args, else vllm-uma's 32) count them, the bytes stay."""
    at_32, at_128 = args(), args("--server-args", "--block-size 128")
    assert (at_32.block_tokens, at_128.block_tokens) == (32, 128)
    assert (at_32.row_bytes, at_128.row_bytes) == (ROW, ROW_128)
    assert (at_32.budget_blocks, at_128.budget_blocks) == (1996, 499)
    assert at_32.pool_blocks == [128, 384, 640, 1456]
    assert at_128.pool_blocks == [32, 96, 160, 364]
    assert at_32.budget_blocks * ROW == at_128.budget_blocks * ROW_128  # 1.47 GB
    for small, large in zip(at_32.pool_blocks, at_128.pool_blocks, strict=True):
        assert small * ROW == large * ROW_128
    # L1 differs only by its half block of slack: 48 tokens' worth.
    l1_32 = pool_split.settings_for(at_32, 128).l1_bytes
    l1_128 = pool_split.settings_for(at_128, 32).l1_bytes
    assert l1_128 - l1_32 == 48 * ROW // 32


def test_working_sets_are_shares_of_the_budget():
    a = args()
    traffic = pool_split.build_traffic(a, a.budget_blocks * a.block_tokens)
    n = {w: len(t.measured) for w, t in traffic.items()}
    # 0.5, 0.9 and 2 x 63,872 tokens in 4,000-token prompts.
    assert n == {"no_reuse": 8, "fits": 8, "equal": 15, "larger": 32, "restart": 32}
    assert traffic["larger"].warmup == traffic["larger"].measured  # served twice


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pool-blocks", "2000"], "leaves no L1"),
        (["--pool-blocks", "0"], "1 block or more"),
        (["--pool-blocks", "a"], "whole numbers"),
        (["--tiers", "disk"], "pool_disk, pool or both"),
        (["--workloads", "nope"], "choose from"),
    ],
)
def test_bad_flags_are_refused_with_the_rule(argv, message, capsys):
    with pytest.raises(SystemExit):
        args(*argv)
    assert message in capsys.readouterr().err


def test_a_model_that_is_neither_a_recipe_nor_a_zoo_build_is_refused(capsys):
    with pytest.raises(SystemExit):
        args("--model", "llama-405b")
    assert "choose a recipe" in capsys.readouterr().err
