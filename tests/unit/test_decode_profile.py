"""tools/benchmark/decode_profile.py's pure parts: py-spy's raw stacks read,
classified and summed. No server, no py-spy."""

from __future__ import annotations

import pytest

from tools.benchmark import decode_profile as dp

FORWARD = (
    "run_engine_core (vllm/v1/engine/core.py:900);step (vllm/v1/engine/core.py:300);"
    "execute_model (vllm/v1/worker/cpu_model_runner.py:50);"
    "forward (vllm/model_executor/models/llama.py:400)"
)
SCHEDULE = (
    "run_engine_core (vllm/v1/engine/core.py:900);schedule (vllm/v1/core/sched/scheduler.py:200)"
)
OURS = SCHEDULE + ";build_connector_meta (vllm_uma/kv_offload/connector.py:90)"


def test_raw_lines_are_stacks_and_counts_summed_per_stack(tmp_path):
    raw = tmp_path / "p.raw"
    raw.write_text(f"{FORWARD} 7\n{SCHEDULE} 2\n{FORWARD} 1\nnot a sample line\n")
    assert dp.read_raw(raw) == {FORWARD: 8, SCHEDULE: 2}


def test_our_frames_anywhere_in_a_stack_make_it_ours_first():
    assert dp.classify(OURS) == "vllm-uma (ours)"  # before "scheduler"
    assert dp.classify(SCHEDULE) == "scheduler"
    assert dp.classify(FORWARD) == "model forward"
    assert dp.classify("thread_main (threading.py:10)") == dp.OTHER


def test_the_summary_gives_shares_of_busy_samples_and_each_leaf_s_own_count():
    summary = dp.summarize({FORWARD: 6, SCHEDULE: 3, OURS: 1})
    assert summary["samples"] == 10
    assert summary["shares"] == {"model forward": 0.6, "scheduler": 0.3, "vllm-uma (ours)": 0.1}
    assert summary["top_own"][0] == ["forward (vllm/model_executor/models/llama.py:400)", 6]


def test_a_bad_command_line_is_refused_with_the_rule(capsys):
    with pytest.raises(SystemExit):
        dp.parse_args(["--tokens", "4"])
    assert "give tokens >= 16" in capsys.readouterr().err
