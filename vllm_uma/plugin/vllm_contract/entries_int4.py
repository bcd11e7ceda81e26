"""Contract entries of 4-bit weights: the GPTQ layout we write.

All are texts read from vLLM's files: the quantizer runs in
``prepare-model``, which imports no vLLM.
"""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract.kinds import Text

RTN = ("vllm_uma.models.gptq_rtn",)
CPU_KERNEL = "vllm.model_executor.kernels.linear.mixed_precision.cpu"
AUTO_GPTQ = "vllm.model_executor.layers.quantization.auto_gptq"

ENTRIES = (
    # -- models/gptq_rtn.py: the layout vLLM's loader and kernel read
    Text(
        AUTO_GPTQ,
        "",
        RTN,
        "4 bits, sym=True is uint4b8: w = (q - 8) * scale",
        text="(4, True): scalar_types.uint4b8,",
    ),
    Text(
        "vllm.model_executor.layers.quantization.utils.quant_utils",
        "",
        RTN,
        "the packing order we write: value i of 8 in bits 4*i (pack_rows)",
        text="res |= (w_q_perm[..., i::pack_factor] & mask) << wtype.size_bits * i",
    ),
    Text(
        "vllm.model_executor.layers.quantization.utils.marlin_utils",
        "",
        RTN,
        "AutoGPTQ's check on CPU takes these group sizes (GROUP_SIZES)",
        text="MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]",
    ),
    *(
        Text(
            CPU_KERNEL,
            "",
            RTN,
            "the CPU kernel takes input and output sizes that are multiples of 32",
            text=f"if c.partition_weight_shape[{dim}] % 32 != 0:",
        )
        for dim in (0, 1)
    ),
    Text(
        "vllm.model_executor.layers.quantization.base_config",
        "",
        RTN,
        "g_idx is written for other GPTQ loaders; vLLM drops it",
        text='return WeightsMapper(orig_to_new_suffix={".g_idx": None})',
    ),
)
