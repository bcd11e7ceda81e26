"""What the worker measures of its memory: its RSS and peak, a request's KV, the breakdown.

Runs in the worker process (plugin/worker.py calls it from ``load_model``,
``determine_available_memory`` and ``initialize_from_config``). The budget
arithmetic itself is memory.py's; this module reads the figures it is fed:
the process's resident set and its peak (Linux /proc), how many workers size
a KV cache from the same RAM, the KV one full-length request needs, and the
figures of the ``memory breakdown:`` line once the KV cache exists.
"""

from __future__ import annotations

import os

import psutil
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

from vllm_uma.plugin.memory import BudgetInputs, MemoryBreakdown


def rss() -> int:
    """This process's resident set, in bytes."""
    return psutil.Process(os.getpid()).memory_info().rss


def reset_peak_rss(clear_refs: str = "/proc/self/clear_refs") -> bool:
    """Start a new peak-RSS window (Linux: writing 5 to clear_refs resets
    VmHWM to the current RSS). False where the kernel does not offer it."""
    try:
        with open(clear_refs, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss(status: str = "/proc/self/status") -> int | None:
    """The process's peak RSS (VmHWM) in bytes, or None if /proc does not say."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def workers_sharing_ram(parallel_config) -> int:
    """Workers on this machine that each size a KV cache from the same RAM."""
    engines = max(1, parallel_config.data_parallel_size_local or 1)
    return max(1, parallel_config.local_world_size) * engines


def kv_allocation_bytes(kv_cache_config: KVCacheConfig) -> int:
    # All KVCacheTensors describe one shared backing allocation of ``size``.
    return max((t.size for t in kv_cache_config.kv_cache_tensors), default=0)


def min_request_kv_bytes(specs: dict[str, KVCacheSpec], vllm_config) -> int:
    """KV bytes one request of max_model_len tokens needs, summed over the
    layers as vLLM counts them (``max_memory_usage_bytes``): every token for
    a full-attention layer, only the window (plus a step's tokens) for a
    sliding-window layer."""
    return sum(spec.max_memory_usage_bytes(vllm_config) for spec in specs.values())


def memory_breakdown(
    vllm_config,
    kv_cache_config: KVCacheConfig,
    budget: BudgetInputs | None,
    weights_bytes: int,
    wired_bytes: int,
    total_ram: int,
) -> MemoryBreakdown:
    """The figures of the ``memory breakdown:`` line. ``budget`` is None
    when vLLM sized the KV cache without asking the worker; ``total_ram``
    then stands in for its total."""
    kv_bytes = kv_allocation_bytes(kv_cache_config)
    num_blocks = kv_cache_config.num_blocks
    groups = kv_cache_config.kv_cache_groups
    block_size = groups[0].kv_cache_spec.block_size if groups else 0
    if len(groups) > 1:
        # Several groups draw on the same blocks: vLLM's group-aware count.
        max_tokens, _ = get_kv_cache_capacity(vllm_config, kv_cache_config)
    else:
        max_tokens = num_blocks * block_size
    return MemoryBreakdown(
        total=budget.total if budget else total_ram,
        budget=budget.budget if budget else 0,
        weights=weights_bytes,
        activations=budget.activations if budget else 0,
        kv_cache=kv_bytes,
        kv_offload_pool=budget.kv_offload_pool if budget else 0,
        wired=wired_bytes,
        per_block_bytes=kv_bytes // num_blocks if num_blocks else 0,
        num_blocks=num_blocks,
        max_tokens_cached=max_tokens,
        block_size=block_size,
        kv_groups=len(groups),
    )
