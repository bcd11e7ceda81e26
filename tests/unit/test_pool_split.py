"""The pool-share sweep's arithmetic: every server one budget, traffic sized from it."""

from __future__ import annotations

import pytest

from tools.benchmark import pool_split

ROW = 2_949_120  # the default model's KV block


def args(*argv):
    return pool_split.parse_args(list(argv))


def test_every_point_has_the_same_budget_and_off_has_it_all():
    a = args("--pool-blocks", "32,160", "--tiers", "pool_disk,pool")
    assert a.row_bytes == ROW and a.pool_blocks == [32, 160]
    for n in a.pool_blocks:
        s = pool_split.settings_for(a, n)
        runner = pool_split.SweepRunner(s, a.out.parent, {})
        budget = 499 * ROW + ROW // 2
        assert runner.l1_bytes("off") == budget
        assert runner.l1_bytes("pool_disk") == budget - n * ROW
        assert runner.l1_bytes("pool") == budget - n * ROW
        disk = runner.server_args("pool_disk", a.out.parent / "d")
        assert disk[disk.index("--kv-offloading-size") + 1] == f"{n * ROW / 2**30:g}"


def test_working_sets_are_shares_of_the_budget():
    a = args()
    traffic = pool_split.build_traffic(a, 499 * 128)
    n = {w: len(t.measured) for w, t in traffic.items()}
    # 0.5, 0.9 and 2 x 63,872 tokens in 4,000-token prompts.
    assert n == {"no_reuse": 8, "fits": 8, "equal": 15, "larger": 32, "restart": 32}
    assert traffic["larger"].warmup == traffic["larger"].measured  # served twice


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pool-blocks", "600"], "leaves no L1"),
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
