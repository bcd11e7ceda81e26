"""The model zoo's configurations and builds (tools/model_zoo/)."""

import json

import pytest

from tools.model_zoo import build
from tools.model_zoo.families import (
    FAMILIES,
    LLAMA3,
    QWEN3,
    TOKENIZER_VOCAB,
    build_name,
    kv_bytes_per_token,
    parse_build_name,
)


@pytest.mark.parametrize(
    ("family", "published"),
    [
        # The KV bytes per token (bf16) of the published models, as their
        # configurations give them: 28 x 8 x 128, 28 x 2 x 128, 16 x 8 x 64...
        ("qwen3", 114_688),
        ("qwen2", 28_672),
        ("llama", 32_768),
        ("mistral", 131_072),
        ("phi3", 393_216),
        ("qwen3_moe", 98_304),
    ],
)
def test_the_real_configurations_have_the_published_kv_bytes_per_token(family, published):
    assert kv_bytes_per_token(FAMILIES[family].config("real"), dtype_bytes=2) == published


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_scaled_down_build_keeps_head_dim_and_the_kv_head_ratio(family):
    real, scaled = FAMILIES[family].config("real"), FAMILIES[family].config("scaled")
    head_dim = lambda c: c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]  # noqa: E731
    assert head_dim(scaled) == head_dim(real)
    ratio = lambda c: c["num_attention_heads"] / c["num_key_value_heads"]  # noqa: E731
    assert ratio(scaled) == ratio(real)
    assert scaled["num_hidden_layers"] == 2 < real["num_hidden_layers"]
    assert scaled["vocab_size"] == real["vocab_size"] == TOKENIZER_VOCAB
    # Every per-family feature is kept (rope scaling, sliding window, experts).
    for key in ("rope_scaling", "sliding_window", "tie_word_embeddings", "norm_topk_prob"):
        assert scaled.get(key) == real.get(key)


def test_names_round_trip_and_an_unknown_one_is_refused_listing_the_builds():
    for family in FAMILIES.values():
        for size in ("scaled", "real"):
            assert parse_build_name(build_name(family, size)) == (family, size)
    with pytest.raises(ValueError, match="zoo-qwen3-scaled"):
        parse_build_name("zoo-qwen4-scaled")
    with pytest.raises(ValueError, match="'real' or 'scaled'"):
        QWEN3.config("tiny")


def test_a_build_is_reused_while_its_record_matches_and_rebuilt_when_it_changes(
    tmp_path, monkeypatch
):
    made = []

    def fake_write(out, family, size, dtype, record):
        made.append(out.name)
        (out / build.RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))

    monkeypatch.setattr(build, "_write", fake_write)
    first = build.build("zoo-llama-scaled", root=tmp_path)
    assert build.build("zoo-llama-scaled", root=tmp_path) == first
    assert len(made) == 1
    monkeypatch.setattr(build, "SEED", build.SEED + 1)  # another seed: another build
    assert build.build("zoo-llama-scaled", root=tmp_path) == first
    assert len(made) == 2
    assert json.loads((first / build.RECORD).read_text())["seed"] == build.SEED
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".partial-")]


def test_a_failed_build_leaves_nothing_where_a_server_looks(tmp_path, monkeypatch):
    def failing_write(out, *_):
        (out / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(build, "_write", failing_write)
    with pytest.raises(OSError):
        build.build("zoo-llama-scaled", root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_llama_build_keeps_llama3_rope_scaling():
    assert LLAMA3.config("scaled")["rope_scaling"]["rope_type"] == "llama3"
