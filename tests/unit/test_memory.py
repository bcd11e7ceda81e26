"""Budget arithmetic and the breakdown line (vllm_uma/plugin/memory.py)."""

import pytest

from vllm_uma.plugin.memory import (
    BudgetInputs,
    GiB,
    MemoryBreakdown,
    MemoryBudgetError,
    kv_cache_bytes,
    parse_breakdown,
)

PER_TOKEN = 23_040  # SmolLM2-135M in bf16: 2 x 30 layers x 3 heads x 64 x 2 B


def inputs(**overrides) -> BudgetInputs:
    base = dict(
        total=24 * GiB,
        utilization=0.5,
        weights=1 * GiB,
        activations=1 * GiB,
        kv_offload_pool=0,
        min_kv_cache=8192 * PER_TOKEN,  # 64 blocks of 128 tokens
        max_model_len=8192,
    )
    base.update(overrides)
    return BudgetInputs(**base)


def test_kv_cache_gets_what_the_budget_leaves():
    assert kv_cache_bytes(inputs()) == 12 * GiB - 2 * GiB


def test_pool_is_carved_out_of_the_budget_not_added():
    without = kv_cache_bytes(inputs())
    with_pool = kv_cache_bytes(inputs(kv_offload_pool=3 * GiB))
    assert without - with_pool == 3 * GiB


def test_workers_on_one_ram_split_the_budget():
    # Two tensor-parallel workers: each gets half, so together they stay
    # within the ceiling instead of claiming it twice.
    assert inputs(workers=2).budget == 6 * GiB
    assert kv_cache_bytes(inputs(workers=2)) == 6 * GiB - 2 * GiB


def test_refusal_with_several_workers_says_so_and_scales_the_fix():
    with pytest.raises(MemoryBudgetError) as err:
        kv_cache_bytes(inputs(utilization=0.1, workers=2))
    msg = str(err.value)
    assert "shared by 2 workers" in msg
    # each worker needs 2.18 GiB: 2 x 2.18 / 24 -> 0.19
    assert "at least 0.19" in msg


def test_exactly_one_request_fits():
    need = inputs().min_kv_cache
    tight = inputs(total=2 * (2 * GiB + need), utilization=0.5)
    assert kv_cache_bytes(tight) == need


def test_refusal_names_the_figures_and_the_fix():
    too_small = inputs(utilization=0.05)  # 1.2 GiB cannot hold 2 GiB of weights+act
    with pytest.raises(MemoryBudgetError) as err:
        kv_cache_bytes(too_small)
    msg = str(err.value)
    assert "--gpu-memory-utilization=0.05" in msg
    assert "weights 1.00 GiB" in msg and "activations 1.00 GiB" in msg
    assert "8192-token request" in msg
    # 2 GiB + 0.18 GiB of one request over 24 GiB -> at least 0.10
    assert "raise --gpu-memory-utilization to at least 0.10" in msg
    assert "lower --max-model-len" in msg
    assert "--kv-offloading-size" not in msg  # no pool, so not suggested


def test_refusal_with_a_pool_suggests_shrinking_it():
    with pytest.raises(MemoryBudgetError) as err:
        kv_cache_bytes(inputs(kv_offload_pool=11 * GiB))
    assert "shrink --kv-offloading-size" in str(err.value)


def test_refusal_when_even_all_ram_is_not_enough_omits_impossible_fix():
    with pytest.raises(MemoryBudgetError) as err:
        kv_cache_bytes(inputs(weights=30 * GiB, utilization=0.9))
    assert "raise --gpu-memory-utilization" not in str(err.value)
    assert "lower --max-model-len" in str(err.value)


def test_breakdown_line_round_trips():
    b = MemoryBreakdown(
        total=25_276_059_648,
        budget=12_638_029_824,
        weights=503_078_912,
        activations=650_354_688,
        kv_cache=11_000_000_000,
        kv_offload_pool=0,
        wired=503_734_272,
        per_block_bytes=2_949_120,
        num_blocks=3729,
        max_tokens_cached=477_312,
    )
    line = "(Worker pid=1) INFO 11-29 13:13:51 [worker.py:169] " + b.log_line()
    assert parse_breakdown(line) == b.__dict__
    assert "memory breakdown: total=25276059648 budget=" in line
    assert line.endswith("wired 0.47 GiB)")


def test_breakdown_line_says_the_pool_stages_for_a_lower_tier():
    b = MemoryBreakdown(
        total=25_276_059_648,
        budget=22_748_453_683,
        weights=503_734_272,
        activations=650_354_688,
        kv_cache=11_000_000_000,
        kv_offload_pool=471_859_200,
        wired=503_734_272,
        per_block_bytes=2_949_120,
        num_blocks=3729,
        max_tokens_cached=477_312,
    )
    line = b.log_line(lower_tier="disk")
    assert parse_breakdown(line) == b.__dict__  # the key=int pairs are unchanged
    assert "kv_offload_pool 0.44 GiB" in line
    assert line.endswith("; the pool stages KV for the disk tier)")
    assert "stages" not in b.log_line()  # the pool is the last tier
    no_pool = MemoryBreakdown(**{**b.__dict__, "kv_offload_pool": 0})
    assert "stages" not in no_pool.log_line(lower_tier="disk")


def test_breakdown_line_of_a_model_with_several_kv_groups():
    # Gemma 3 270M: six groups of three layers draw on one set of blocks.
    b = MemoryBreakdown(
        total=25_275_990_016,
        budget=7_582_797_004,
        weights=1_328_336_896,
        activations=651_476_992,
        kv_cache=4_529_061_888,
        kv_offload_pool=0,
        wired=1_328_934_912,
        per_block_bytes=393_216,
        num_blocks=11_518,
        max_tokens_cached=344_362,
        block_size=128,
        kv_groups=6,
    )
    line = b.log_line()
    assert parse_breakdown(line) == b.__dict__
    assert "block_size=128 kv_groups=6 (" in line
    assert line.endswith("; 6 KV cache groups share the blocks)")
