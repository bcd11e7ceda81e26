"""4-bit GPTQ linears through PyTorch's CPU int4 matmul, where vLLM's own op is slower.

Why. vLLM CPU 0.32 computes a GPTQ layer (4 bits, symmetric: uint4b8)
with its ``cpu_gemm_wna16`` op (CPUWNA16LinearKernel), which on a CPU
without AMX runs a decode step's linears no faster than bf16 (124.6
against 125.2 ms on Qwen2.5-Coder-1.5B, weights read from memory;
tools/benchmark/int4_kernel.py, docs/benchmark.md). PyTorch ships its own
CPU int4 matmul, ``aten._weight_int4pack_mm_for_cpu`` (the one gpt-fast
and torchao use), which does the same layers in 52.0 ms there. This
kernel computes GPTQ layers with it.

Where it plugs in, and in which process. vLLM chooses a mixed-precision
linear kernel per layer (``choose_mp_linear_kernel``) from a per-platform
list in priority order, while the engine core builds the model;
``register_linear_kernel`` (public) appends a kernel to that list, and
``VLLM_DISABLED_KERNELS`` (a documented environment variable, read at each
choice until vLLM caches its environment after start-up) takes a kernel
out of the choice. :func:`install` does both in the engine core, from
UmaWorker.load_model just before vLLM builds the model, when the model's
quantization is GPTQ: it appends :class:`TorchInt4LinearKernel` and adds
``CPUWNA16LinearKernel`` to ``VLLM_DISABLED_KERNELS`` in that process's
environment, so ours is chosen where vLLM's would have been. Nothing
crosses a process boundary. A CPU without AVX-512 never gets here with
4-bit weights (preflight_int4 refuses them before vLLM loads).
``VLLM_UMA_INT4_KERNEL=vllm`` keeps vLLM's own op (for comparison, or if
this one is ever wrong).

What it computes. GPTQ's uint4b8 weight is ``(q - 8) * scale`` per group
of ``group_size`` inputs, with no zero point (AutoGPTQ's linear method
sets zero_points=False for uint4b8). PyTorch's op computes
``x @ ((q - 8) * scale + zero).T`` per group, so the zero is 0. At load
(process_weights_after_loading, once per layer) the GPTQ ``qweight``
(input-major, 8 nibbles an int32, value i in bits 4*i) is unpacked with
vLLM's own helper, transposed to [out, in] and packed by PyTorch's
``_convert_weight_to_int4pack_for_cpu``; ``scales`` [groups, out] become
``[groups, out, 2]`` (scale, 0) in the activation dtype. The result is
checked against a bf16 reference in tests/unit/test_int4_linear.py.
"""

from __future__ import annotations

import os

import torch
from vllm.model_executor.kernels.linear import register_linear_kernel
from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import (
    MPLinearKernel,
    MPLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils import replace_parameter
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    unpack_quantized_values_into_int32,
)
from vllm.platforms import PlatformEnum
from vllm.scalar_type import scalar_types

from vllm_uma.log import get_logger
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.int4_choice import CHOICE_ENV, chosen

vllm_contract.require(__name__)

logger = get_logger(__name__)

VLLM_KERNEL = "CPUWNA16LinearKernel"
DISABLED_ENV = "VLLM_DISABLED_KERNELS"
# vLLM's names for AutoGPTQConfig (quantization/__init__.py). Not AWQ: its
# layers have zero points, which ours does not take; with vLLM's op taken
# out of the choice they would have no kernel at all.
GPTQ_METHODS = ("gptq", "auto_gptq", "gptq_marlin")
# PyTorch's CPU int4 matmul takes these group sizes (its kernel's check).
GROUP_SIZES = (32, 64, 128, 256)


def install(quantization: str | None, environ=os.environ) -> bool:
    """Make our kernel vLLM's choice for a GPTQ model's 4-bit linears, in
    this process (the engine core, before the model is built); True if it
    did."""
    if (quantization or "").lower() not in GPTQ_METHODS or chosen(environ) != "torch":
        return False
    register_linear_kernel(TorchInt4LinearKernel, PlatformEnum.CPU, "mp")
    disabled = [k for k in environ.get(DISABLED_ENV, "").split(",") if k]
    if VLLM_KERNEL not in disabled:
        environ[DISABLED_ENV] = ",".join([*disabled, VLLM_KERNEL])
    logger.info(
        "4-bit GPTQ linears through PyTorch's CPU int4 matmul (%s; %s=vllm keeps vLLM's "
        "cpu_gemm_wna16).",
        TorchInt4LinearKernel.__name__,
        CHOICE_ENV,
    )
    return True


class TorchInt4LinearKernel(MPLinearKernel):
    """GPTQ uint4b8 linears on PyTorch's CPU int4 matmul (module docstring)."""

    @classmethod
    def get_min_capability(cls) -> int:
        return -1

    @classmethod
    def can_implement(cls, c: MPLinearLayerConfig) -> tuple[bool, str | None]:
        k, n = c.partition_weight_shape
        if c.weight_type != scalar_types.uint4b8 or c.zero_points:
            return False, f"{c.weight_type} with zero points={c.zero_points}: uint4b8 only"
        if c.act_type not in (torch.bfloat16, torch.float16, torch.float32):
            return False, f"activations in {c.act_type}"
        group = k if c.group_size == -1 else c.group_size
        if group not in GROUP_SIZES or k % group:
            return False, f"group size {c.group_size} for {k} inputs: one of {GROUP_SIZES}"
        if n % 32:
            return False, f"{n} outputs: a multiple of 32 only"
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        c = self.config
        k, _ = c.partition_weight_shape
        packed = getattr(layer, self.w_q_name)
        codes = unpack_quantized_values_into_int32(packed.data, c.weight_type, 0)
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.t().contiguous(), 1)
        scales = getattr(layer, self.w_s_name).data.to(c.act_type)
        scale_zeros = torch.stack([scales, torch.zeros_like(scales)], dim=-1).contiguous()
        replace_parameter(layer, self.w_q_name, torch.nn.Parameter(weight, requires_grad=False))
        replace_parameter(
            layer, self.w_s_name, torch.nn.Parameter(scale_zeros, requires_grad=False)
        )
        if self.w_zp_name is not None:
            setattr(layer, self.w_zp_name, None)  # uint4b8 has none: free its bytes
        layer.int4_group = k if c.group_size == -1 else c.group_size

    def apply_weights(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight = getattr(layer, self.w_q_name)
        scale_zeros = getattr(layer, self.w_s_name)
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, weight, layer.int4_group, scale_zeros
        )
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
