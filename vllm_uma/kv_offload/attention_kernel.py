"""Which CPU attention kernel writes the KV bytes: part of the disk namespace.

vLLM's CPU attention writes the KV cache through a kernel chosen per
machine and per KV cache group (``_get_attn_isa`` in
vllm/v1/attention/backends/cpu_attn.py: ``amx`` with AMX tiles for bf16 and
blocks of 32k tokens, ``neon`` on Arm, ``vec`` or ``vec16`` otherwise, and
more), and ``cpu_attn_reshape_and_cache`` is given that choice. A block
another kernel wrote may be laid out otherwise, so a store shared across
machines (a shared volume, a migrated VM, a copied cache) would restore
wrong KV under a valid checksum. The kernels therefore join the namespace
inputs: blocks written by one kernel are never read through another.

Where it runs: in the engine core, in our connector's __init__
(connector.py), where vLLM's config is resolved (the block size the CPU
platform chose) and the KV cache groups are known; the API server, which
reads the other namespace inputs (disk/namespace_inputs.py), has neither.
The result is a new, frozen plan for the spec; the settings plan itself is
not changed.
"""

from __future__ import annotations

import dataclasses

from vllm_uma.kv_offload.config import OffloadPlan
from vllm_uma.kv_offload.disk.namespace_inputs import NamespaceInputs
from vllm_uma.plugin import vllm_contract

vllm_contract.require(__name__)

INPUT = "cpu_attention_kernels"


def attention_kernels(vllm_config, kv_cache_config) -> list[str]:
    """What vLLM's CPU attention builder chooses for each KV cache group,
    with the same arguments (CPUAttentionMetadataBuilder.__init__)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    dtype = vllm_config.model_config.dtype
    cache_dtype = vllm_config.cache_config.cache_dtype
    kernels = set()
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        try:
            kernels.add(
                _get_attn_isa(dtype, spec.block_size, getattr(spec, "head_size", None), cache_dtype)
            )
        except NotImplementedError as exc:  # vLLM refuses this group's layout itself
            kernels.add(f"none ({exc})")
    return sorted(kernels)


def with_attention_kernels(offload: OffloadPlan, vllm_config, kv_cache_config) -> OffloadPlan:
    """``offload`` whose namespace inputs also name the kernels; unchanged
    without a disk or network tier (nothing is filed across restarts or machines)."""
    if offload.lower_tier is None or offload.namespace_inputs is None:
        return offload
    inputs = offload.namespace_inputs.values()
    inputs[INPUT] = attention_kernels(vllm_config, kv_cache_config)
    return dataclasses.replace(offload, namespace_inputs=NamespaceInputs.of(inputs))
