"""The CPU attention kernels join the disk namespace
(vllm_uma/kv_offload/attention_kernel.py): asked of vLLM the way its CPU
attention builder asks, per KV cache group, and a store written through
one kernel is another namespace than one written through another.

Nothing here assumes this machine's CPU: the expected kernels are what
vLLM's own function answers here, and the two-kernel case replaces that
function's answer."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.v1.attention.backends import cpu_attn
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

from vllm_uma.kv_offload import attention_kernel as ak
from vllm_uma.kv_offload.config import OffloadPlan, PoolSize
from vllm_uma.kv_offload.disk.namespace_inputs import NamespaceInputs


def spec(cls, block_size: int, head_size: int, **kw):
    return cls(
        block_size=block_size, num_kv_heads=1, head_size=head_size, dtype=torch.bfloat16, **kw
    )


VLLM = SimpleNamespace(
    model_config=SimpleNamespace(dtype=torch.bfloat16),
    cache_config=SimpleNamespace(cache_dtype="auto"),
)
KV = SimpleNamespace(
    kv_cache_groups=[
        KVCacheGroupSpec(["full.0"], spec(FullAttentionSpec, 128, 64)),
        KVCacheGroupSpec(["slide.0"], spec(SlidingWindowSpec, 128, 64, sliding_window=512)),
        KVCacheGroupSpec(["odd.0"], spec(FullAttentionSpec, 128, 80)),  # 80 % 32 != 0
    ]
)


def plan(disk=True) -> OffloadPlan:
    return OffloadPlan(
        spec_name="x",
        pool=PoolSize(1, "given", False),
        disk=SimpleNamespace(root_dir="/kv") if disk else None,
        namespace_inputs=NamespaceInputs.of({"model": "m"}),
        warnings=(),
    )


def test_the_kernels_are_vllms_own_choice_for_each_group():
    expected = {
        cpu_attn._get_attn_isa(torch.bfloat16, 128, 64, "auto"),
        cpu_attn._get_attn_isa(torch.bfloat16, 128, 80, "auto"),
    }
    assert ak.attention_kernels(VLLM, KV) == sorted(expected)
    assert "vec16" in expected  # a head size that is no multiple of 32: vLLM's vec16


def test_the_kernels_join_the_namespace_inputs_and_change_the_namespace(monkeypatch):
    from tests.unit.test_namespace_inputs import OFFLOADING
    from vllm_uma.kv_offload.disk.namespace import namespace_for

    ids = []
    for machine in ("amx", "vec"):
        monkeypatch.setattr(cpu_attn, "_get_attn_isa", lambda *a, m=machine: m)
        inputs = ak.with_attention_kernels(plan(), VLLM, KV).namespace_inputs.values()
        assert inputs == {"model": "m", ak.INPUT: [machine]}
        ids.append(namespace_for(OFFLOADING, "fp", inputs).id)
    assert ids[0] != ids[1]


def test_without_a_disk_tier_the_plan_is_left_as_it_is():
    without = plan(disk=False)
    assert ak.with_attention_kernels(without, VLLM, KV) is without


def test_a_group_vllm_cannot_run_is_named_not_raised(monkeypatch):
    def refuse(*args):
        raise NotImplementedError("FP8 KV cache requires head_size divisible by 32 on CPU.")

    monkeypatch.setattr(cpu_attn, "_get_attn_isa", refuse)
    assert ak.attention_kernels(VLLM, KV) == [
        "none (FP8 KV cache requires head_size divisible by 32 on CPU.)"
    ]
