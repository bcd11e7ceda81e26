"""Every setting that shapes the KV bytes changes the disk tier's namespace
(vllm_uma/kv_offload/disk/namespace_inputs.py), and what cannot be keyed
safely is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_uma.kv_offload.disk import namespace_inputs as ni
from vllm_uma.kv_offload.disk.namespace import namespace_for
from vllm_uma.plugin.vllm_contract.entries_core import NAMESPACE_MODEL_FIELDS


def config(**changes):
    model = SimpleNamespace(
        model="/models/smol",
        revision=None,
        dtype="torch.bfloat16",
        quantization=None,
        hf_overrides={},
        trust_remote_code=False,
        is_multimodal_model=False,
        hf_config_path=None,
        code_revision=None,
        model_impl="auto",
        config_format="auto",
        quantization_config=None,
        model_class_overrides=None,
    )
    load = SimpleNamespace(load_format="auto", download_dir=None)
    cache = SimpleNamespace(cache_dtype="auto")
    cfg = SimpleNamespace(
        model_config=model, load_config=load, cache_config=cache, lora_config=None
    )
    for path, value in changes.items():
        section, name = path.split(".")
        setattr(getattr(cfg, section), name, value)
    return cfg


OFFLOADING = SimpleNamespace(
    model=SimpleNamespace(name="/models/smol", dtype="bfloat16"),
    kv_cache_layout="NHD",
    worker_kv_bytes_per_block=2_949_120,
    cache=SimpleNamespace(tokens_per_hash=128, blocks_per_chunk=1),
    parallel=SimpleNamespace(world_size=1),
    groups=[SimpleNamespace(tokens_per_block=128, layer_names=("layer.0",))],
)


def namespace_id(cfg) -> bytes:
    return namespace_for(OFFLOADING, "weights-digest", ni.namespace_inputs(cfg)).id


BASE = namespace_id(config())


@pytest.mark.parametrize(
    "change",
    [
        {"model_config.revision": "v2"},
        {"load_config.download_dir": "/data/hub"},
        {"model_config.dtype": "torch.float32"},
        {"cache_config.cache_dtype": "fp8"},
        {"model_config.quantization": "fp8"},
        {"model_config.hf_overrides": {"rope_scaling": {"type": "linear", "factor": 2.0}}},
        {"load_config.load_format": "safetensors"},
        {"model_config.model": "/models/other"},
        {"model_config.hf_config_path": "/configs/other"},
        {"model_config.code_revision": "abc123"},
        {"model_config.model_impl": "transformers"},
        {"model_config.quantization_config": {"bits": 4}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_each_setting_changes_the_namespace(change):
    assert namespace_id(config(**change)) != BASE


@pytest.mark.parametrize("field", NAMESPACE_MODEL_FIELDS)
def test_each_model_field_the_contract_lists_changes_the_namespace(field):
    # One tuple for the contract's check and the namespace: none listed and left out.
    assert namespace_id(config(**{f"model_config.{field}": "another"})) != BASE


def test_the_same_settings_give_the_same_namespace():
    assert namespace_id(config()) == BASE


def test_the_vllm_version_changes_the_namespace(monkeypatch):
    import vllm_uma.plugin.vllm_version as version

    monkeypatch.setattr(version, "installed_vllm_version", lambda: "0.33.0")
    assert namespace_id(config()) != BASE


def test_remote_code_is_part_of_the_namespace(tmp_path):
    (tmp_path / "modeling_x.py").write_text("def forward(): return 1\n")
    trusting = config(
        **{"model_config.model": str(tmp_path), "model_config.trust_remote_code": True}
    )
    before = namespace_id(trusting)
    (tmp_path / "modeling_x.py").write_text("def forward(): return 2\n")
    assert namespace_id(trusting) != before


def test_the_other_namespace_inputs_change_it_too():
    assert (
        namespace_for(OFFLOADING, "weights-digest").id
        != namespace_for(OFFLOADING, "other-weights").id
    )


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"load_config.load_format": "dummy"}, "--load-format dummy gives random weights"),
        ({"config.lora_config": object()}, "LoRA adapters cannot be used with the disk tier"),
        ({"model_config.is_multimodal_model": True}, "is a multimodal model"),
    ],
)
def test_what_cannot_be_keyed_is_refused_in_one_line(change, fragment):
    ((path, value),) = change.items()
    if path.startswith("config."):
        cfg = config()
        setattr(cfg, path.split(".")[1], value)
    else:
        cfg = config(**change)
    with pytest.raises(ni.NamespaceInputsError) as caught:
        ni.namespace_inputs(cfg)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
