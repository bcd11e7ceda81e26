"""The KV block size vllm-uma serves with: 32 tokens unless the user says.

vLLM caches a prompt's KV in whole blocks: a prefix hit reuses every full
block and computes the partial last one again, up to one block less a
token. vLLM CPU 0.32 sets 128-token blocks when no ``--block-size`` is
given (``CpuPlatform.check_and_update_config``), so a repeated 1,000-token
prompt recomputed 104 tokens on every hit (7 x 128 + 104), where llama.cpp
recomputes one. Its CPU attention takes any multiple of 32
(``CPU_ATTN: [MultipleOf(32)]``; its AMX path too, for bf16, at any
multiple of 32: ``cpu_attn._get_attn_isa``), on AMX, AVX-512 and AVX2
CPUs alike, and nothing smaller ("No common block size for 16").
Measured at the Llama-3.2-1B shape in bf16 (issue 43's table): the same
1k prompt again 0.300 s at 128 against 0.068 s at 32, decode 19.2 against
26.3 tokens/s, the cold prompt the same (2.44 s, 2.46 s).

Where it acts: the platform's config hook (``UmaPlatform.
check_and_update_config``), in every process that builds vLLM's config
(the API server, the engine core), right after vLLM CPU's own, which is
where vLLM chose 128. Only when the user gave no ``--block-size`` and
vLLM chose its general default: the MLA (16) and DeepSeek-V4 (256) sizes
are those kernels' requirements and stay. Hybrid (Mamba) models align
their block size later from this one, as vLLM does from its own.

Everything below L1 follows the block: one pool row, disk file, network
value and ledger row per block; the namespace of the disk and network
tiers includes the block size, so stores written at 128 are not read at
32 (they are another namespace, left to their own eviction).
"""

from __future__ import annotations

from vllm_uma.plugin import vllm_contract

# The vLLM texts this relies on (where vLLM CPU sets 128; what its attention takes).
vllm_contract.require(__name__)

DEFAULT_BLOCK_TOKENS = 32
# What vLLM CPU 0.32 sets when the user gives no --block-size.
VLLM_CPU_DEFAULT_BLOCK_TOKENS = 128


def apply_default(cache_config) -> bool:
    """Set :data:`DEFAULT_BLOCK_TOKENS` where vLLM CPU put its general
    default; whether it did."""
    if cache_config.user_specified_block_size:
        return False
    if cache_config.block_size != VLLM_CPU_DEFAULT_BLOCK_TOKENS:
        return False  # a kernel's own requirement (MLA 16, DeepSeek-V4 256)
    cache_config.block_size = DEFAULT_BLOCK_TOKENS
    return True
