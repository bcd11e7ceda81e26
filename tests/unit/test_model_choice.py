"""The benchmarks' --model (tools/benchmark/lib/model_choice.py)."""

import json

import pytest

from tools.benchmark.lib import model_choice


def write_config(directory, **fields):
    config = dict(
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        hidden_size=1024,
    )  # fmt: skip
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**config, **fields}))
    return directory


def test_a_directory_is_served_by_path_under_its_name(tmp_path):
    directory = write_config(tmp_path / "my-model")
    choice = model_choice.choose(str(directory))
    assert choice.serve_args == [str(directory), "--served-model-name", "my-model"]
    assert choice.kv_bytes_per_token() == 114_688  # Qwen3-0.6B's shape
    assert "real weights" in choice.describe()


def test_a_directory_without_a_config_is_refused_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="no config.json"):
        model_choice.choose(str(tmp_path))


def test_a_server_whose_kv_is_not_what_the_workload_was_sized_for_stops_the_run(tmp_path):
    choice = model_choice.choose(str(write_config(tmp_path / "m")))
    model_choice.check_breakdown(choice, {"per_block_bytes": 114_688 * 32, "block_size": 32}, 32)
    model_choice.check_breakdown(choice, {"per_block_bytes": 114_688 * 128}, 128)
    with pytest.raises(SystemExit, match="reports 7,340,032 KV bytes per block"):
        model_choice.check_breakdown(choice, {"per_block_bytes": 114_688 * 64}, 32)


def test_a_server_at_another_block_size_than_its_flags_give_stops_the_run(tmp_path):
    # A workload sized for 32-token blocks on a server that runs 128 (a
    # model whose kernel requires its own) is refused, naming the fix.
    choice = model_choice.choose(str(write_config(tmp_path / "m")))
    served = {"per_block_bytes": 114_688 * 128, "block_size": 128}
    with pytest.raises(SystemExit, match="runs 128-token KV blocks.*sized .* for 32.*--block-size"):
        model_choice.check_breakdown(choice, served, 32)


def test_the_copy_bandwidth_tool_takes_a_recipe_a_zoo_build_or_a_directory(tmp_path, monkeypatch):
    from tools.benchmark import kv_pool_bandwidth
    from vllm_uma import models

    built = []
    monkeypatch.setattr(models, "prepare", lambda name=None: built.append(name) or tmp_path)
    assert kv_pool_bandwidth.model_directory(models.DEFAULT_MODEL_NAME) == tmp_path
    assert built == [models.DEFAULT_MODEL_NAME]  # a recipe is built by its recipe
    directory = write_config(tmp_path / "my-model")
    assert kv_pool_bandwidth.model_directory(str(directory)) == directory
    assert built == [models.DEFAULT_MODEL_NAME]
