"""The host pool's size: sized from the KV budget, made final by the worker, read by the connector.

An automatic pool (no size given by the user) is sized twice, by
:func:`auto_pool_size`: by the platform in the API server, provisionally,
from the whole budget (kv_offload/config.py), and by the worker once the
weights and activations are measured (:func:`resize_auto_pool`). The
worker's size is a result: it is recorded in the engine's context
(plugin/engine_context.py), and the connectors build the spec from it
(:func:`spec_config`), handing vLLM's spec a copy of the extra config with
that ``cpu_bytes_to_use``. vLLM's own
``kv_connector_extra_config`` keeps the provisional size; nothing edits it
after start-up.

Process: the API server's (the provisional size), the worker's and the
connector's. The worker runs ``determine_available_memory`` before the
engine core builds either side of the connector, and both sides see the
final size in their engine's context (plugin/engine_context.py, which
says why they are one process). Where the worker is elsewhere, nothing is
recorded in this process and the spec is sized from the provisional size,
as vLLM's dict would have sized it.

What the automatic size is for. On unified memory the pool and the KV cache
(L1) are the same RAM: a block in the pool is a copy of bytes L1 could have
kept, so a pool adds no capacity, and every GiB it takes is a GiB of L1 less
(docs/benchmark.md, "The pool's share at equal memory"). It cannot go
where a lower tier exists, because vLLM's tiering moves every block through
its primary tier: a store goes L1 -> pool -> disk, and a restore from the
disk is promoted into pool rows, the whole hit prefix of a request at once,
before the copy into L1 (vLLM's ``TieringOffloadingManager._initiate_promotion``:
with no free row the chunk is a miss and is recomputed). So with a lower
tier the automatic pool is a *staging area*, sized from what must pass
through it at once (:func:`staging_tokens`): the prefixes of
``STAGED_RESTORES`` concurrent full-length restores, and
``STAGED_STORE_STEPS`` steps of computed KV on their way down. L1 gets the
rest of the budget. With no lower tier the pool can only hold copies of
what L1 held, and the start-up log says so (:data:`POOL_ONLY_NOTE`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config.py imports this module: the plan's type only
    from vllm_uma.kv_offload.config import OffloadPlan


@dataclass(frozen=True)
class PoolSize:
    bytes: int
    reason: str  # for the log: where the size came from
    # The size is ours to choose (the user gave none): the worker sizes it
    # again once the weights and activations are measured (resize_auto_pool).
    auto: bool = False


def kv_bytes_per_token(model_config, parallel_config, cache_dtype: str = "auto") -> int:
    """K and V of every layer for one token, in the KV cache's own dtype
    (``--kv-cache-dtype``: an fp8 cache stores one byte per element, not the
    model's two)."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    layers = model_config.get_num_layers(parallel_config)
    heads = model_config.get_num_kv_heads(parallel_config)
    head_size = model_config.get_head_size()
    dtype_bytes = kv_cache_dtype_str_to_dtype(cache_dtype, model_config).itemsize
    return 2 * layers * heads * head_size * dtype_bytes


# A staging pool holds at once: the whole prefixes of this many restores
# from the lower tier (one being copied into L1 while the next is read), ...
STAGED_RESTORES = 2
# ... and this many scheduler steps of newly computed KV on its way down
# (stored from L1 in one step, written to the lower tier while the next
# step computes).
STAGED_STORE_STEPS = 2

POOL_ONLY_NOTE = (
    "KV offloading: the host pool has no lower tier; on unified memory it holds copies of "
    "blocks that L1 could keep in the same RAM, so it adds no capacity (at equal memory "
    "it measured slower than L1 alone: docs/benchmark.md). Add a disk tier "
    "(secondary_tiers) to keep KV past L1 and restarts, or leave the budget to L1."
)


def staging_tokens(max_model_len: int, max_num_batched_tokens: int) -> int:
    """The tokens of KV a staging pool holds (see the module's docstring)."""
    return STAGED_RESTORES * max_model_len + STAGED_STORE_STEPS * max_num_batched_tokens


def auto_pool_size(
    per_token: int,
    max_model_len: int,
    kv_budget: int,
    budget_name: str = "the KV budget",
    *,
    lower_tier: str | None = None,
    max_num_batched_tokens: int = 0,
) -> PoolSize:
    """The automatic pool, at most a quarter of ``kv_budget``: with a lower
    tier (named, for the log) a staging area for it; with none, two
    full-length requests of KV."""
    if lower_tier is not None:
        tokens = staging_tokens(max_model_len, max_num_batched_tokens)
        what = (
            f"a staging area for the {lower_tier} tier: {STAGED_RESTORES} restores of "
            f"max_model_len={max_model_len} tokens + {STAGED_STORE_STEPS} steps of "
            f"max_num_batched_tokens={max_num_batched_tokens} on their way down; "
            f"L1 gets the rest of the budget"
        )
    else:
        tokens = 2 * max_model_len
        what = f"KV of 2 x max_model_len={max_model_len} tokens"
    wanted = tokens * per_token
    cap = max(0, kv_budget) // 4
    if wanted <= cap:
        return PoolSize(wanted, what)
    return PoolSize(cap, f"{what}, clamped to 1/4 of {budget_name}")


def resize_auto_pool(vllm_config, offload: OffloadPlan | None, left: int) -> PoolSize | None:
    """The automatic pool size again, from ``left``: the budget left once the
    weights and the activations' peak are measured (the worker, before the
    engine core builds the connector). A result, not an edit of vLLM's
    config: the worker records it in the engine's context
    (plugin/engine_context.py) and the connectors size the spec from it. None
    when the size was given by the user, or offloading is off."""
    if offload is None or not offload.pool.auto:
        return None
    model, cache = vllm_config.model_config, vllm_config.cache_config
    per_token = kv_bytes_per_token(model, vllm_config.parallel_config, cache.cache_dtype)
    size = auto_pool_size(
        per_token,
        model.max_model_len,
        left,
        "the budget left after weights and activations",
        lower_tier=offload.lower_tier,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
    )
    return PoolSize(size.bytes, size.reason, auto=True)


def pool_for(offload: OffloadPlan, final: PoolSize | None) -> PoolSize:
    """The pool size the spec is built with: the worker's (``final``, from
    the engine's context), when the size was ours to choose (automatic) and
    the worker recorded it in this process; else the plan's."""
    if offload.pool.auto:
        return final or offload.pool
    return offload.pool


def spec_config(offloading_config, offload: OffloadPlan, final: PoolSize | None):
    """vLLM's OffloadingConfig for our spec, with the final pool size.

    A user-given size is left as vLLM wrote it (``--kv-offloading-size`` in
    GiB times 2**30, or cpu_bytes_to_use). An automatic one is the worker's,
    in a copy of the extra config: vLLM's dict is not edited."""
    if not offload.pool.auto:
        return offloading_config
    size = pool_for(offload, final)
    extra = {**offloading_config.extra_config, "cpu_bytes_to_use": size.bytes}
    return dataclasses.replace(offloading_config, extra_config=extra)
