"""Round-to-nearest 4 bits in GPTQ's layout (models/gptq_rtn.py), read back by vLLM's own code.

vLLM's unpack helpers (quant_utils), AutoGPTQConfig and the CPU int4
kernel's shape rule are the real ones; only the weights are made up.
"""

from __future__ import annotations

import pytest
import torch
from vllm.model_executor.kernels.linear import MPLinearLayerConfig
from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    pack_quantized_values_into_int32,
    unpack_quantized_values_into_int32,
)
from vllm.scalar_type import scalar_types

from vllm_uma.models import gptq_rtn
from vllm_uma.models.recipe import PrepareError
from vllm_uma.plugin.int4_linear import TorchInt4LinearKernel

# (out, in) of one decoder layer's linears; SmolLM2-135M: hidden 576,
# intermediate 1536, 3 KV heads of 64. Qwen2.5-Coder-1.5B: 1536, 8960, 2 of 128.
SMOLLM2 = {"q": (576, 576), "k": (192, 576), "o": (576, 576), "up": (1536, 576),
           "down": (576, 1536)}  # fmt: skip
QWEN25_15B = {"q": (1536, 1536), "k": (256, 1536), "up": (8960, 1536), "down": (1536, 8960)}


def weights(rows: int = 64, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """bf16 weights as a checkpoint holds them, with an outlier and a group of zeros."""
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    w[3, 7] = 1.5  # one wide group
    w[5, :64] = 0.0  # an all-zero group
    return w.to(torch.bfloat16)


def test_vllm_unpacks_the_codes_and_its_dequantization_is_the_rtn_value():
    w = weights()
    packed = gptq_rtn.quantize(w, group=64)
    codes = unpack_quantized_values_into_int32(packed.qweight, scalar_types.uint4b8, 0)  # [in, out]
    assert codes.shape == (256, 64)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    step = packed.scales.float().repeat_interleave(64, dim=0)  # [in, out]
    # The RTN value, from the stored scale: nearest level, levels -8..7.
    rtn = (torch.round(w.float().t() / step).clamp(-8, 7)) * step
    vllm_value = (codes - scalar_types.uint4b8.bias).float() * step
    assert torch.equal(vllm_value, rtn)
    assert torch.equal(gptq_rtn.dequantize(packed).t(), rtn)
    # Within half a step of the original (float32 division may add an ulp).
    assert ((w.float().t() - vllm_value).abs() <= step * (0.5 + 1e-6)).all()
    # And the bits are exactly what vLLM's own packer makes of the codes.
    assert torch.equal(pack_quantized_values_into_int32(codes, scalar_types.uint4b8, 0),
                       packed.qweight)  # fmt: skip


def test_zeros_g_idx_and_dtypes_are_gptq_v1():
    packed = gptq_rtn.quantize(weights(), group=64)
    assert packed.qweight.dtype == torch.int32 and packed.qweight.shape == (32, 64)
    assert packed.scales.dtype == torch.float16 and packed.scales.shape == (4, 64)
    zeros = unpack_quantized_values_into_int32(packed.qzeros, scalar_types.uint4b8, 1)
    assert zeros.shape == (4, 64) and bool((zeros == 7).all())  # zero 8, stored minus one
    assert torch.equal(packed.g_idx, torch.arange(256, dtype=torch.int32) // 64)


def test_scales_are_exact_in_bfloat16_and_cover_the_widest_weight():
    w = weights()
    packed = gptq_rtn.quantize(w, group=64)
    # vLLM casts the scales to the activations' dtype: bf16 loses nothing.
    assert torch.equal(packed.scales.to(torch.bfloat16).to(torch.float16), packed.scales)
    widest = w.float().reshape(64, 4, 64).abs().amax(-1).t()
    assert (packed.scales.float() * 7.5 >= widest).all()
    assert (packed.scales > 0).all()  # the zero group too: no division by zero


@pytest.mark.parametrize("group", [32, 64, 128])
def test_vllm_accepts_the_config(group):
    config = gptq_rtn.quantization_config(group, "SmolLM2-135M-Instruct")
    assert AutoGPTQConfig.override_quantization_method(config, None) == "auto_gptq"
    parsed = AutoGPTQConfig.from_config(config)
    assert parsed.quant_type == scalar_types.uint4b8
    assert (parsed.weight_bits, parsed.group_size, parsed.desc_act) == (4, group, False)
    assert parsed.lm_head_quantized is False
    # What the preflight refuses float32 by: vLLM's config would, later.
    assert torch.float32 not in AutoGPTQConfig.get_supported_act_dtypes()


@pytest.mark.parametrize("shapes, group", [(SMOLLM2, 64), (QWEN25_15B, 128)])
def test_group_size_of_the_recipes_and_vllms_cpu_kernel_takes_every_layer(shapes, group):
    assert gptq_rtn.group_size_for(shapes) == group
    for rows, cols in shapes.values():
        config = MPLinearLayerConfig(
            full_weight_shape=(cols, rows),
            partition_weight_shape=(cols, rows),
            weight_type=scalar_types.uint4b8,
            act_type=torch.bfloat16,
            group_size=group,
            zero_points=False,
        )
        assert CPUWNA16LinearKernel.can_implement(config) == (True, None)
        assert TorchInt4LinearKernel.can_implement(config) == (True, None)  # ours, which serves it


def test_a_shape_that_cannot_be_grouped_is_refused_with_the_rule():
    with pytest.raises(PrepareError) as err:
        gptq_rtn.group_size_for({**SMOLLM2, "model.layers.0.mlp.down_proj.weight": (576, 1520)})
    assert str(err.value) == (
        "model.layers.0.mlp.down_proj.weight has input size 1520, not a multiple of 32: "
        "vLLM CPU's int4 kernel (CPUWNA16) takes only multiples of 32. This model cannot "
        "be served in int4; serve its unquantized weights."
    )
    with pytest.raises(PrepareError, match="k has output size 200, not a multiple of 32"):
        gptq_rtn.group_size_for({"k": (200, 576)})
