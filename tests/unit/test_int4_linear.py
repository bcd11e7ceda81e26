"""plugin/int4_linear.py: GPTQ 4-bit linears on PyTorch's CPU int4 matmul.

The kernel runs in this process on a layer our own quantizer packed
(models/gptq_rtn.py, the layout vLLM's AutoGPTQ loader reads), against the
weight those tensors stand for; and vLLM's own kernel chooser picks it once
it is installed. No server: the kernel is vLLM's interface and PyTorch's op.
"""

from __future__ import annotations

import os

import pytest
import torch
from vllm.model_executor.kernels.linear import choose_mp_linear_kernel
from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import (
    MPLinearLayerConfig,
)
from vllm.scalar_type import scalar_types

from vllm_uma.models import gptq_rtn
from vllm_uma.plugin import int4_linear
from vllm_uma.plugin.int4_linear import TorchInt4LinearKernel


def _config(k: int, n: int, group: int, **changes) -> MPLinearLayerConfig:
    fields = dict(
        full_weight_shape=(k, n),
        partition_weight_shape=(k, n),
        weight_type=scalar_types.uint4b8,
        act_type=torch.bfloat16,
        group_size=group,
        zero_points=False,
    )
    return MPLinearLayerConfig(**{**fields, **changes})


def _gptq_layer(k: int, n: int, group: int, bias: bool = False):
    """A layer as vLLM's AutoGPTQ method leaves it after loading our build."""
    torch.manual_seed(k + n + group)
    packed = gptq_rtn.quantize(torch.randn(n, k) * 0.05, group)
    layer = torch.nn.Module()
    for name in ("qweight", "scales", "qzeros"):
        data = getattr(packed, name)
        data = data.to(torch.bfloat16) if name == "scales" else data
        layer.register_parameter(name, torch.nn.Parameter(data, requires_grad=False))
    layer.bias = torch.randn(n, dtype=torch.bfloat16) if bias else None
    return layer, gptq_rtn.dequantize(packed, torch.bfloat16)


@pytest.mark.parametrize(
    "k, n, group, rows", [(256, 96, 128, 1), (512, 64, 64, 4), (128, 32, 32, 7)]
)
def test_the_kernel_computes_what_the_gptq_tensors_stand_for(k, n, group, rows):
    layer, weight = _gptq_layer(k, n, group, bias=True)
    kernel = TorchInt4LinearKernel(_config(k, n, group), "qweight", "scales", "qzeros")
    kernel.process_weights_after_loading(layer)
    assert layer.qzeros is None  # uint4b8 has no zero points: their bytes are freed
    x = torch.randn(2, rows, k, dtype=torch.bfloat16)
    got = kernel.apply_weights(layer, x, layer.bias)
    want = x.float() @ weight.float().t() + layer.bias.float()
    assert got.shape == (2, rows, n) and got.dtype == torch.bfloat16
    # bf16 output of a float32 accumulation: within bf16's rounding of the result.
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_a_wrong_unpacking_would_be_seen():
    # The check above can fail: a weight whose codes are off by one step
    # gives another product than the tensors stand for.
    layer, weight = _gptq_layer(256, 64, 128)
    layer.qweight.data += 1  # every row-0 code of each word one step up
    kernel = TorchInt4LinearKernel(_config(256, 64, 128), "qweight", "scales", "qzeros")
    kernel.process_weights_after_loading(layer)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            kernel.apply_weights(layer, x).float(),
            x.float() @ weight.float().t(),
            rtol=2e-2,
            atol=2e-2,
        )


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"zero_points": True}, "zero points=True"),
        ({"weight_type": scalar_types.uint8b128}, "uint4b8 only"),
        ({"group_size": 96}, "group size 96"),
        ({"partition_weight_shape": (256, 48)}, "48 outputs"),
    ],
)
def test_what_it_cannot_take_is_left_to_vllm_s_other_kernels_with_the_reason(changes, says):
    ok, reason = TorchInt4LinearKernel.can_implement(_config(256, 64, 128, **changes))
    assert not ok and says in reason


def test_installed_for_gptq_it_is_vllm_s_choice(monkeypatch):
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "SomeUserKernel")
    assert int4_linear.install("gptq")
    assert os.environ["VLLM_DISABLED_KERNELS"] == "SomeUserKernel,CPUWNA16LinearKernel"
    assert choose_mp_linear_kernel(_config(1536, 2048, 128)) is TorchInt4LinearKernel
    assert int4_linear.install("auto_gptq")  # again (a second engine in this process): still ours
    assert choose_mp_linear_kernel(_config(1536, 2048, 128)) is TorchInt4LinearKernel
    assert os.environ["VLLM_DISABLED_KERNELS"] == "SomeUserKernel,CPUWNA16LinearKernel"


@pytest.mark.parametrize("quantization, choice", [("awq", ""), (None, ""), ("gptq", "vllm")])
def test_not_installed_for_other_weights_or_when_vllm_s_op_is_asked_for(quantization, choice):
    environ = {"VLLM_UMA_INT4_KERNEL": choice}
    assert not int4_linear.install(quantization, environ)
    assert "VLLM_DISABLED_KERNELS" not in environ


def test_a_bad_choice_is_refused_with_the_values_it_takes():
    with pytest.raises(ValueError, match=r"VLLM_UMA_INT4_KERNEL='fast' is invalid: it must be "):
        int4_linear.install("gptq", {"VLLM_UMA_INT4_KERNEL": "fast"})
