"""4-bit weights by round-to-nearest, in the GPTQ layout vLLM's AutoGPTQ loader reads.

No calibration data: each group of ``group_size`` consecutive input weights
of a row gets one scale, ``max|w| * 2/15``, and each weight the nearest of
16 levels, ``w ~ (q - 8) * scale`` with ``q`` in 0..15 (vLLM's ``uint4b8``,
GPTQ's symmetric 4 bits). Every weight ends within half a step of its
original. This is GPTQ's *format*, not its method: GPTQ proper corrects
each rounding error with calibration data; round-to-nearest does not.

The tensors of one Linear, whose torch weight is ``[out, in]``::

    qweight  int32 [in/8, out]     8 codes per int32 along the input dim:
                                   input k's code in bits 4*(k%8).. of row k//8
    scales   fp16  [in/g, out]     one per group of g inputs and output row
    qzeros   int32 [in/g, out/8]   0x77777777: the symmetric zero 8, stored
                                   minus one as AutoGPTQ's v1 format does
                                   (vLLM ignores them for uint4b8)
    g_idx    int32 [in]            k // g: no activation order (vLLM drops it)

The scales are rounded up to bfloat16's precision before they are stored in
fp16, so a server in bfloat16 (vLLM casts the scales to the activations'
dtype) computes with exactly the stored values; the codes are rounded
against those final scales.

Process: runs in ``vllm-uma prepare-model`` and in tests; imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vllm_uma.models.recipe import PrepareError
from vllm_uma.plugin import vllm_contract

vllm_contract.require(__name__)

BITS = 4
PACK = 32 // BITS  # codes per int32
BIAS = 8  # uint4b8: w = (q - 8) * scale
LEVELS = 2**BITS - 1  # q in 0..15
# vLLM CPU's int4 kernel (CPUWNA16LinearKernel.can_implement) takes input and
# output sizes that are multiples of 32; AutoGPTQ's check on CPU
# (marlin_utils.MARLIN_SUPPORTED_GROUP_SIZES) takes groups of 32, 64 or 128.
KERNEL_MULTIPLE = 32
GROUP_SIZES = (128, 64, 32)  # largest first: fewer scales to read per weight
ZERO_WORD = sum((BIAS - 1) << (BITS * i) for i in range(PACK))  # 0x77777777


@dataclass(frozen=True)
class Packed:
    qweight: torch.Tensor
    scales: torch.Tensor
    qzeros: torch.Tensor
    g_idx: torch.Tensor

    @staticmethod
    def of(tensors: Mapping[str, torch.Tensor], stem: str) -> "Packed":
        """Layer ``stem``'s four tensors of a checkpoint (``stem.qweight`` ...)."""
        return Packed(*(tensors[f"{stem}.{part}"] for part in PARTS))


PARTS = ("qweight", "scales", "qzeros", "g_idx")  # Packed's fields, as checkpoints name them


def group_size_for(shapes: Mapping[str, tuple[int, int]]) -> int:
    """The largest of GROUP_SIZES that divides every input size of
    ``shapes`` (name -> (out, in)); refused, naming the first tensor that
    breaks a rule, if vLLM CPU's int4 kernel cannot take one."""
    if not shapes:
        raise PrepareError("no linear weights to quantize were found. Nothing was built.")
    for name, (rows, cols) in shapes.items():
        for what, size in (("output", rows), ("input", cols)):
            if size % KERNEL_MULTIPLE:
                raise PrepareError(
                    f"{name} has {what} size {size}, not a multiple of {KERNEL_MULTIPLE}: "
                    f"vLLM CPU's int4 kernel (CPUWNA16) takes only multiples of "
                    f"{KERNEL_MULTIPLE}. This model cannot be served in int4; serve its "
                    f"unquantized weights."
                )
    for group in GROUP_SIZES:
        if all(cols % group == 0 for _, cols in shapes.values()):
            return group
    raise AssertionError("unreachable: every input size is a multiple of 32")


def _at_least(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The smallest ``dtype`` value >= each positive ``x`` (float32)."""
    y = x.to(dtype)
    # For positive finite floats the next bit pattern is the next value up.
    up = (y.view(torch.int16) + 1).view(dtype)
    return torch.where(y.float() < x, up, y)


def quantize(weight: torch.Tensor, group: int) -> Packed:
    """Round-to-nearest 4 bits of ``weight`` ``[out, in]``, in GPTQ's layout."""
    rows, cols = weight.shape
    w = weight.float().reshape(rows, cols // group, group)
    # The widest weight of a group maps to +-7.5 steps (the levels span
    # -8..7); a group of zeros gets the smallest fp16 step, not a zero one.
    raw = (w.abs().amax(dim=-1) * (2 / LEVELS)).clamp(min=2.0**-24)
    scales = _at_least(_at_least(raw, torch.bfloat16).float(), torch.float16)
    if not torch.isfinite(scales).all():
        raise PrepareError(
            f"a weight group's scale overflows fp16 (largest weight "
            f"{w.abs().max().item():.3g}): these weights cannot be stored in GPTQ's format."
        )
    step = scales.float().unsqueeze(-1)
    codes = (torch.round(w / step) + BIAS).clamp(0, LEVELS).to(torch.int64)
    codes = codes.reshape(rows, cols)
    return Packed(
        qweight=pack_rows(codes.t()),
        scales=scales.t().contiguous(),
        qzeros=torch.full((cols // group, rows // PACK), _as_int32(ZERO_WORD), dtype=torch.int32),
        g_idx=torch.arange(cols, dtype=torch.int32) // group,
    )


def _as_int32(word: int) -> int:
    """An unsigned 32-bit word as the signed int32 with the same bits."""
    return word - 2**32 if word >= 2**31 else word


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """``[k, n]`` codes 0..15 -> ``[k/8, n]`` int32, row k's code in bits 4*(k%8)."""
    k, n = codes.shape
    parts = codes.to(torch.int64).reshape(k // PACK, PACK, n)
    shifts = (torch.arange(PACK, dtype=torch.int64) * BITS).reshape(1, PACK, 1)
    words = (parts << shifts).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_rows`: ``[k/8, n]`` int32 -> ``[k, n]`` codes."""
    unsigned = words.to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(PACK, dtype=torch.int64) * BITS).reshape(1, PACK, 1)
    codes = (unsigned.unsqueeze(1) >> shifts) & LEVELS
    return codes.reshape(-1, words.shape[1])


def dequantize(packed: Packed, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``[out, in]`` weight the tensors stand for, scales cast to
    ``dtype`` first as vLLM casts them to the activations' dtype."""
    codes = unpack_rows(packed.qweight)  # [in, out]
    group = codes.shape[0] // packed.scales.shape[0]
    scales = packed.scales.to(dtype).float().repeat_interleave(group, dim=0)
    return ((codes - BIAS).float() * scales).t().to(dtype)


def quantization_config(group: int, source: str) -> dict:
    """config.json's ``quantization_config`` (and quantize_config.json): the
    keys vLLM's AutoGPTQConfig.from_config reads, and what this is."""
    return {
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
        "bits": BITS,
        "group_size": group,
        "sym": True,
        "desc_act": False,
        "lm_head": False,
        "vllm_uma": {
            "method": "round-to-nearest, no calibration data: made locally, not a published GPTQ",
            "source": source,
        },
    }
