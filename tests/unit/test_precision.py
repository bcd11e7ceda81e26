"""--dtype auto on a CPU without bf16 arithmetic (vllm_uma/plugin/precision.py)."""

import pytest
import torch
import vllm.config.model as vllm_model_config

from vllm_uma.plugin import precision
from vllm_uma.plugin.platform import UmaPlatform

VLLM_X86 = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture
def platform_with(monkeypatch):
    """Our platform as vLLM's config code sees it, on a CPU with or
    without bf16 arithmetic."""

    def make(bf16: bool) -> UmaPlatform:
        monkeypatch.setattr(precision, "has_bf16_arithmetic", lambda: bf16)
        uma = UmaPlatform()
        monkeypatch.setattr(vllm_model_config, "current_platform", uma)
        return uma

    return make


@pytest.mark.parametrize("checkpoint", [torch.bfloat16, torch.float16, torch.float32])
def test_auto_serves_every_checkpoint_in_float32_without_bf16_arithmetic(platform_with, checkpoint):
    platform_with(bf16=False)
    resolved = vllm_model_config._resolve_auto_dtype("llama", checkpoint, is_pooling_model=False)
    assert resolved == torch.float32


def test_auto_keeps_vllm_s_choice_with_bf16_arithmetic(platform_with):
    platform_with(bf16=True)
    resolve = vllm_model_config._resolve_auto_dtype
    assert resolve("llama", torch.bfloat16, is_pooling_model=False) == torch.bfloat16
    # vLLM downcasts a float32 checkpoint where bf16 is fast.
    assert resolve("llama", torch.float32, is_pooling_model=False) == torch.bfloat16


def test_an_explicit_bfloat16_is_served_as_asked(platform_with):
    platform_with(bf16=False)
    config = type("Config", (), {"model_type": "llama", "dtype": torch.bfloat16})()
    dtype = vllm_model_config._get_and_verify_dtype("m", config, "bfloat16", is_pooling_model=False)
    assert dtype == torch.bfloat16


def test_the_note_says_why_only_where_float32_was_chosen_for_speed():
    assert "no bfloat16 arithmetic" in precision.auto_note(torch.float32, False)
    assert "--dtype bfloat16" in precision.auto_note(torch.float32, False)
    assert precision.auto_note(torch.bfloat16, False) is None
    assert precision.auto_note(torch.float32, True) is None


def test_other_architectures_keep_vllm_s_list(monkeypatch):
    precision.has_bf16_arithmetic.cache_clear()
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")
    try:
        assert precision.has_bf16_arithmetic() is True
    finally:
        precision.has_bf16_arithmetic.cache_clear()
    assert precision.supported_dtypes(VLLM_X86, True) == VLLM_X86


def test_an_x86_cpu_is_told_by_avx512_bf16_or_amx(monkeypatch):
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    for avx512_bf16, amx, expected in [
        (False, False, False),
        (True, False, True),
        (False, True, True),
    ]:
        precision.has_bf16_arithmetic.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert precision.has_bf16_arithmetic() is expected
    precision.has_bf16_arithmetic.cache_clear()


def test_no_note_when_the_command_line_chose_the_dtype():
    assert precision.dtype_given(["vllm-uma", "serve", "--dtype", "float32"])
    assert precision.dtype_given(["serve", "--dtype=float32"])
    assert not precision.dtype_given(["serve", "--max-model-len", "2048", "--dtype-x"])
    # --dtype auto leaves the choice to the plugin, as no flag does: the line is said.
    assert not precision.dtype_given(["serve", "--dtype", "auto"])
    assert not precision.dtype_given(["serve", "--dtype=AUTO"])
    assert precision.auto_note(torch.float32, False, given=True) is None
