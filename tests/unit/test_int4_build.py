"""A recipe's 4-bit build (models/int4.py): the directory vLLM's loader reads.

A tiny Llama made by transformers stands in for a recipe's build; vLLM's
AutoGPTQConfig decides from the written files which layers it quantizes,
and its weight mapper what it drops.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM
from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig

from vllm_uma.models import gemma3, gptq_rtn, int4, int4_check, prepare_int4
from vllm_uma.models.publish import MANIFEST_NAME, Manifest
from vllm_uma.models.recipe import Int4Check, PrepareError, Recipe, Source

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip
CHECK = Int4Check("What is the capital of France?", start="Paris", tokens=2)


def tiny_llama(directory: Path) -> Path:
    """A 2-layer Llama whose linears take 64 and 128 inputs: groups of 64."""
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, vocab_size=96, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    (directory / "tokenizer.json").write_text("{}")
    (directory / "NOTICE").write_text("the source's notice\n")
    (directory / MANIFEST_NAME).write_text("{}")
    return directory


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    source = tiny_llama(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("int4")
    assert int4.build_from(source, out, "Tiny", lambda _: None) == 64
    return source, out


def test_the_config_says_gptq_and_what_it_is(built):
    _, out = built
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == gptq_rtn.quantization_config(64, "Tiny")
    assert config["hidden_size"] == 64  # the rest of the source's config
    assert json.loads((out / "quantize_config.json").read_text())["bits"] == 4
    assert "not a published GPTQ" in config["quantization_config"]["vllm_uma"]["method"]


def test_linears_are_packed_the_rest_is_unchanged(built):
    source, out = built
    before, after = load_file(source / "model.safetensors"), load_file(out / "model.safetensors")
    for layer in range(2):
        for proj in PROJ:
            stem = f"model.layers.{layer}.{proj}"
            assert f"{stem}.weight" not in after
            want = gptq_rtn.quantize(before[f"{stem}.weight"], 64)
            assert torch.equal(gptq_rtn.Packed.of(after, stem).qweight, want.qweight)
    unquantized = [name for name in before if not name.endswith("_proj.weight")]
    assert "model.embed_tokens.weight" in unquantized and "lm_head.weight" not in after
    for name in unquantized:
        assert torch.equal(after[name], before[name]), name


def test_vllm_quantizes_exactly_the_packed_layers_and_drops_g_idx(built):
    _, out = built
    config = AutoGPTQConfig.from_config(gptq_rtn.quantization_config(64, "Tiny"))
    config.maybe_update_config(str(out))  # reads the safetensors' dtypes, as vLLM does
    want = {f"model.layers.{layer}.{proj}" for layer in range(2) for proj in PROJ}
    assert set(config.modules_in_block_to_quantize) == want
    kept = [name for name, _ in config.get_checkpoint_weight_mapper().apply(
        [("model.layers.0.mlp.up_proj.g_idx", None), ("model.layers.0.mlp.up_proj.qweight", None)]
    )]  # fmt: skip
    assert kept == ["model.layers.0.mlp.up_proj.qweight"]


def test_files_are_copied_and_the_notice_says_what_changed(built):
    _, out = built
    assert (out / "tokenizer.json").read_text() == "{}"
    assert (out / "generation_config.json").is_file()
    assert not (out / MANIFEST_NAME).exists()  # publish.py writes this build's own
    notice = (out / "NOTICE").read_text()
    assert notice.startswith("the source's notice\n")
    words = " ".join(notice.split())
    assert "by round-to-nearest" in words and "not a published GPTQ checkpoint" in words


def test_transformers_reads_the_build_as_its_dequantized_weights(built):
    source, out = built
    model = int4_check.load_model(out)
    stored = load_file(out / "model.safetensors")
    stem = "model.layers.1.mlp.down_proj"
    weight = model.get_parameter(f"{stem}.weight")
    assert torch.equal(
        weight, gptq_rtn.dequantize(gptq_rtn.Packed.of(stored, stem), torch.bfloat16)
    )
    assert model.lm_head.weight is model.model.embed_tokens.weight
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 96) and torch.isfinite(logits).all()


def test_an_already_quantized_source_is_refused(built, tmp_path):
    _, out = built
    with pytest.raises(PrepareError, match="is already quantized"):
        int4.build_from(out, tmp_path, "Tiny", lambda _: None)


def test_a_wrong_answer_is_not_published():
    with pytest.raises(PrepareError) as err:
        int4_check.judge("transformers", CHECK, "Lyon")
    assert "expected it to start with 'Paris'" in str(err.value)
    assert str(err.value).endswith("Nothing was published.")
    int4_check.judge("transformers", CHECK, "Paris, of course")


def test_no_served_check_on_a_cpu_without_avx512(monkeypatch, tmp_path):
    from vllm_uma.plugin import cpu_features

    monkeypatch.setattr(cpu_features, "read", lambda: cpu_features.CpuFeatures(False, False))
    said = []
    int4_check.served(CHECK, "x", tmp_path, said.append)  # no server: tmp_path is no model
    assert said and said[0].startswith("no served check: this CPU has no AVX-512")


def fake_base(tmp_path: Path) -> Recipe:
    def build(source: Source, out_dir: Path, progress) -> None:
        tiny_llama(out_dir)
        (out_dir / MANIFEST_NAME).unlink()

    return Recipe(
        name="Tiny", version=3, summary="a fake", int4=CHECK,
        locate=lambda: Source(tmp_path, "ab" * 32), build=build, check=lambda d, p: None,
    )  # fmt: skip


def test_the_derived_recipe_prepares_its_base_and_builds_beside_it(tmp_path):
    derived = int4.derived(fake_base(tmp_path), tmp_path / "cache", lambda _: None)
    assert derived.name == "Tiny-int4-rtn"
    assert derived.version == 3 * 100 + int4.INT4_VERSION  # either version rebuilds it
    source = derived.locate()
    base_dir = tmp_path / "cache" / "models" / "Tiny"
    assert source == Source(base_dir, "ab" * 32)  # the base's GGUF: a new one rebuilds both
    assert Manifest.read(base_dir / MANIFEST_NAME).recipe_version == 3
    out = tmp_path / "out"
    out.mkdir()
    derived.build(source, out, lambda _: None)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["group_size"] == 64


def test_a_recipe_without_an_int4_check_has_no_int4_build(tmp_path):
    with pytest.raises(PrepareError) as err:
        prepare_int4(gemma3.NAME, tmp_path)
    assert str(err.value).startswith("gemma-3-270m has no 4-bit build")
    assert not (tmp_path / "models").exists()  # refused before anything is built
