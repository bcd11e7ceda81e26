"""The memory benchmarks' --model, without a server: the flags each server is
started with, the vocabulary check, the burst's size, the breakdown check."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools.benchmark import memory_benchmark, memory_common, memory_pressure
from tools.benchmark.lib import model_choice
from tools.benchmark.lib.prompts import MODEL, prompt_ids

SMOLLM2 = dict(
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    hidden_size=576, vocab_size=49_152,
)  # fmt: skip
QWEN3_06B = dict(
    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    hidden_size=1024, vocab_size=49_152,
)  # fmt: skip
COMMON = ["--enforce-eager", "--gpu-memory-utilization", "0.5"]


def model_dir(path: Path, config: dict) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def default_choice(tmp_path, monkeypatch):
    """choose(None), the default model prepared at a directory of SmolLM2's shape."""
    from vllm_uma import models

    directory = model_dir(tmp_path / "SmolLM2-135M-Instruct", SMOLLM2)
    monkeypatch.setattr(models, "prepare", lambda *a, **k: directory)
    return model_choice.choose(None)


@pytest.fixture
def zoo_choice(tmp_path, monkeypatch):
    """choose("zoo-qwen3-real"), built at a directory of Qwen3-0.6B's shape."""
    from tools.model_zoo import build

    directory = model_dir(tmp_path / "zoo-qwen3-real-bfloat16", QWEN3_06B)
    monkeypatch.setattr(build, "build", lambda name, dtype: directory)
    return model_choice.choose("zoo-qwen3-real")


class Recorder:
    """Stands in for Server and StockServer: keeps what it was started with."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


# --- arguments ---------------------------------------------------------------


def test_without_model_both_benchmarks_keep_the_default_model_and_burst():
    assert memory_benchmark.parse_args([]).model is None
    args = memory_pressure.parse_args([])
    assert (args.model, args.burst_tokens, args.pool_gib) == (None, None, 4)


def test_both_benchmarks_take_a_model():
    assert memory_benchmark.parse_args(["--model", "zoo-qwen3-real"]).model == "zoo-qwen3-real"
    assert memory_pressure.parse_args(["--model", "/m/dir"]).model == "/m/dir"


def test_memory_benchmark_pressure_passes_the_model_on(monkeypatch):
    seen = []
    monkeypatch.setattr(memory_pressure, "main", lambda argv: seen.append(argv) or 0)
    assert memory_benchmark.main(["--pressure", "--model", "zoo-qwen3-real"]) == 0
    assert seen == [["--model", "zoo-qwen3-real"]]


# --- server flags ------------------------------------------------------------


def test_the_default_models_servers_get_the_flags_they_had(default_choice, monkeypatch):
    assert memory_common.flags("plugin", default_choice, 0.5) == COMMON
    assert memory_common.flags("stock", default_choice, 0.5) == COMMON
    monkeypatch.setattr(memory_common, "StockServer", Recorder)
    stock = memory_common.server("stock", default_choice, 0.5, Path("s.log"))
    assert stock.args[:3] == (default_choice.directory, MODEL, COMMON)


def test_a_zoo_builds_plugin_server_serves_its_directory_under_its_name(zoo_choice, monkeypatch):
    monkeypatch.setattr(memory_common, "Server", Recorder)
    plugin = memory_common.server("plugin", zoo_choice, 0.9, Path("p.log"), ("--x", "1"))
    directory = str(zoo_choice.directory)
    assert plugin.args[1] == [
        directory, "--served-model-name", "zoo-qwen3-real",
        "--enforce-eager", "--gpu-memory-utilization", "0.9", "--x", "1",
    ]  # fmt: skip


def test_a_zoo_builds_stock_server_gets_its_directory_and_name(zoo_choice, monkeypatch):
    monkeypatch.setattr(memory_common, "StockServer", Recorder)
    stock = memory_common.server("stock", zoo_choice, 0.5, Path("s.log"))
    # StockServer puts --model DIR --served-model-name NAME before the flags.
    assert stock.args[:3] == (zoo_choice.directory, "zoo-qwen3-real", COMMON)


def test_the_pressure_servers_serve_the_model_with_their_pool(zoo_choice, monkeypatch, tmp_path):
    monkeypatch.setattr(memory_common, "Server", Recorder)
    args = memory_pressure.parse_args(["--model", "zoo-qwen3-real"])
    srv = memory_pressure.pressure_server("feature", zoo_choice, args, tmp_path, {})
    flags = srv.args[1]
    assert flags[:3] == zoo_choice.serve_args
    assert flags[flags.index("--kv-offloading-size") + 1] == "4"


def test_prompts_name_the_served_model(monkeypatch):
    sent = []

    def post(path, payload, timeout):
        sent.append(payload)
        return {"usage": {"prompt_tokens": len(payload["prompt"])}}

    fake = SimpleNamespace(post=post)
    assert memory_common.send_prompts(fake, "zoo-qwen3-real", 0, 3, 5, 2) == 15
    assert {p["model"] for p in sent} == {"zoo-qwen3-real"}


# --- vocabulary --------------------------------------------------------------


def test_the_id_limit_is_the_prompts_own():
    top = max(max(prompt_ids(i, 2000)) for i in range(50))
    assert memory_common.PROMPT_ID_LIMIT - 10 <= top < memory_common.PROMPT_ID_LIMIT


def test_a_zoo_vocabulary_holds_the_prompts(zoo_choice):
    memory_common.check_vocabulary(zoo_choice)


def test_a_smaller_vocabulary_is_refused_naming_the_value_and_the_fix(tmp_path):
    directory = model_dir(tmp_path / "small", {**QWEN3_06B, "vocab_size": 32_000})
    choice = model_choice.choose(str(directory))
    with pytest.raises(SystemExit) as refused:
        memory_common.check_vocabulary(choice)
    message = str(refused.value)
    assert f"vocab_size=32,000 in {directory / 'config.json'} is too small" in message
    assert "token ids up to 48,999" in message
    assert "Choose a model with a larger vocabulary" in message


def test_a_config_without_a_vocabulary_is_refused(tmp_path):
    config = {k: v for k, v in QWEN3_06B.items() if k != "vocab_size"}
    choice = model_choice.choose(str(model_dir(tmp_path / "novocab", config)))
    with pytest.raises(SystemExit, match="has no vocab_size"):
        memory_common.check_vocabulary(choice)


def test_a_vocabulary_in_text_config_counts(tmp_path):
    config = {k: v for k, v in QWEN3_06B.items() if k != "vocab_size"}
    directory = model_dir(tmp_path / "nested", {**config, "text_config": {"vocab_size": 262_144}})
    memory_common.check_vocabulary(model_choice.choose(str(directory)))


def test_the_benchmarks_refuse_the_model_before_any_server(tmp_path):
    directory = model_dir(tmp_path / "small", {**QWEN3_06B, "vocab_size": 32_000})
    with pytest.raises(SystemExit, match="vocab_size=32,000"):
        memory_common.prepared(tmp_path / "out" / "m.json", str(directory))


def test_an_unknown_zoo_build_is_said_not_raised(tmp_path):
    assert memory_common.prepared(tmp_path / "m.json", "zoo-no-such-build") is None


# --- sizes from the model ----------------------------------------------------


def test_the_default_burst_is_unchanged_for_the_default_model(default_choice):
    args = memory_pressure.parse_args([])
    assert memory_pressure.burst_tokens(args, default_choice.kv_bytes_per_token()) == 100_000


def test_the_default_burst_holds_the_same_kv_bytes_for_another_model(zoo_choice):
    args = memory_pressure.parse_args(["--model", "zoo-qwen3-real"])
    per_token = zoo_choice.kv_bytes_per_token()
    assert per_token == 114_688
    assert memory_pressure.burst_tokens(args, per_token) == 2_304_000_000 // 114_688


def test_a_given_burst_is_kept(zoo_choice):
    args = memory_pressure.parse_args(["--burst-tokens", "30000"])
    assert memory_pressure.burst_tokens(args, zoo_choice.kv_bytes_per_token()) == 30_000


def test_a_burst_with_fewer_prompts_than_revisits_is_refused():
    args = memory_pressure.parse_args(["--burst-tokens", "5000", "--revisit", "8"])
    with pytest.raises(SystemExit) as refused:
        memory_pressure.burst_tokens(args, 23_040)
    message = str(refused.value)
    assert "--burst-tokens is 5,000 tokens, 3 prompts of 2,000" in message
    assert "Set --revisit 3 or less, or --burst-tokens 16,000 or more" in message


def test_a_model_with_much_kv_per_token_is_refused_by_the_default_burst():
    args = memory_pressure.parse_args([])
    with pytest.raises(SystemExit, match="the default burst for this model is 7,031 tokens"):
        memory_pressure.burst_tokens(args, 327_680)


# --- the breakdown -----------------------------------------------------------


def breakdown_server(per_block_bytes: int, block: int, argv: tuple = ()) -> SimpleNamespace:
    """A started server whose command line is ``argv`` and whose breakdown
    line says ``block``-token blocks of ``per_block_bytes``."""
    line = (
        f"memory breakdown: kv_cache=1000 per_block_bytes={per_block_bytes} "
        f"block_size={block} (1 GiB)"
    )
    proc = SimpleNamespace(args=["vllm-uma", "serve", *argv])
    return SimpleNamespace(log=lambda: line, log_path=Path("p.log"), proc=proc)


def test_the_plugins_kv_is_checked_against_the_model_at_its_block_size(zoo_choice):
    # The block size comes from the server's command line: vllm-uma's
    # default (32 tokens) without --block-size.
    right = breakdown_server(114_688 * 32, 32)
    assert memory_benchmark.kv_cache_bytes("plugin", right, zoo_choice)[0] == 1000
    at_128 = breakdown_server(114_688 * 128, 128, ("--block-size", "128"))
    assert memory_benchmark.kv_cache_bytes("plugin", at_128, zoo_choice)[0] == 1000
    with pytest.raises(SystemExit, match="reports 737,280 KV bytes per block"):
        memory_benchmark.kv_cache_bytes("plugin", breakdown_server(737_280, 32), zoo_choice)
    with pytest.raises(SystemExit, match="runs 128-token KV blocks"):
        memory_benchmark.kv_cache_bytes("plugin", breakdown_server(114_688 * 128, 128), zoo_choice)


def test_give_back_time_counts_from_the_hog_step_before_the_mark_when_no_sample_crossed_it(
    monkeypatch,
):
    from types import SimpleNamespace

    from tools.benchmark import memory_pressure_sampler as sampler

    gib = 1 << 30
    monkeypatch.setattr(sampler.psutil, "virtual_memory", lambda: SimpleNamespace(total=20 * gib))

    def sample(t, available, kv, phase="hog"):
        return {"t": t, "phase": phase, "available": available, "kv": kv, "psi_some_us": None}

    # Mark 2 GiB: the server gave back between 2.1 and 2.2 s, before any
    # sample saw MemAvailable under it.
    samples = [
        sample(1.0, 3 * gib, 4 * gib, "idle"),
        sample(2.0, 2.5 * gib, 4 * gib),
        sample(2.1, 2.1 * gib, 4 * gib),
        sample(2.7, 4.0 * gib, 0),
    ]
    assert sampler.seconds_to_give_back(samples, 4 * gib) == 0.6
    # A sample under the mark is the onset when there is one.
    samples[2] = sample(2.1, 1.9 * gib, 4 * gib)
    assert sampler.seconds_to_give_back(samples, 4 * gib) == 0.6
    samples[2] = sample(2.1, 2.9 * gib, 4 * gib)  # never near the mark
    assert sampler.seconds_to_give_back(samples, 4 * gib) is None
