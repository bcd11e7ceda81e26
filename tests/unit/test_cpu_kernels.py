"""The refusal of a oneDNN cap vLLM's bf16 kernels abort under (vllm_uma/plugin/cpu_kernels.py)."""

import pytest
import torch

from vllm_uma.plugin import cpu_kernels
from vllm_uma.plugin.cpu_kernels import ONEDNN_ISAS, onednn_cap_refusal


@pytest.mark.parametrize("cap", ["AVX2", "avx2", " AVX512_CORE ", "AVX512_CORE_VNNI", "SSE41"])
def test_a_cap_below_avx512_core_bf16_on_amx_with_bf16_is_refused_naming_it(cap):
    reason = onednn_cap_refusal(cap, amx_tiles=True, dtype="bfloat16")
    assert reason is not None
    assert f"ONEDNN_MAX_CPU_ISA={cap}" in reason
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 or higher" in reason  # the fix
    assert "--dtype float32" in reason


@pytest.mark.parametrize(
    "cap",
    [
        "AVX512_CORE_BF16",
        "AVX10_1_512",
        "AVX512_CORE_AMX",
        "avx10_1_512_amx",
        "DEFAULT",
        "BOGUS",
        "",
        None,
    ],
)
def test_caps_that_keep_bf16_brgemm_and_names_onednn_ignores_are_accepted(cap):
    assert onednn_cap_refusal(cap, amx_tiles=True, dtype="bfloat16") is None


def test_without_amx_tiles_or_in_float32_no_cap_is_refused():
    # vLLM takes its AMX-chosen kernels only with AMX tiles, and only for
    # bf16: the torch linear fallback under AVX2 is what test_serve runs.
    assert onednn_cap_refusal("AVX2", amx_tiles=False, dtype="bfloat16") is None
    assert onednn_cap_refusal("AVX2", amx_tiles=True, dtype="float32") is None


def test_every_name_below_the_lowest_working_cap_is_refused():
    lowest = ONEDNN_ISAS.index(cpu_kernels.LOWEST_BF16_CAP)
    for index, name in enumerate(ONEDNN_ISAS):
        refused = onednn_cap_refusal(name, amx_tiles=True, dtype="bfloat16") is not None
        assert refused == (index < lowest), name


def test_the_hook_reads_the_environment_and_the_dtype(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with pytest.raises(ValueError, match="ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN"):
        cpu_kernels.check_onednn_cap(torch.bfloat16)
    cpu_kernels.check_onednn_cap(torch.float32)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    cpu_kernels.check_onednn_cap(torch.bfloat16)
