"""Translate vLLM's offloading flags to vllm-uma's spec, or refuse them.

Runs in the API server, in the platform's ``check_and_update_config``, before
any weights load and before vLLM's own ``_post_init_kv_transfer_config``
(which then fills in the connector, ``cpu_bytes_to_use`` and ``kv_role`` from
``--kv-offloading-size`` as usual). What we add: our connector's module
(``kv_connector_module_path``), our spec's name in
``kv_connector_extra_config``, the pool size when only the connector is
named, and a clear refusal for what the host pool does not support.

What vLLM reads stays in ``kv_connector_extra_config``; what only we read
(the pool is ours to settle, the resolved disk tier, the namespace inputs)
is returned in the :class:`OffloadPlan`, which travels in the plugin's one
settings plan (plugin/settings.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_uma.kv_offload.disk.config import DiskTierConfig, parse_disk_tier
from vllm_uma.kv_offload.disk.namespace_inputs import (
    NamespaceInputs,
    NamespaceInputsError,
    namespace_inputs,
)
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.memory import GiB

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

CONNECTOR = "OffloadingConnector"
# Our subclass of it (no block lost when the pool is full). vLLM resets the
# connector name from --kv-offloading-size after the platform hook but
# keeps the module path, and looks the name up there.
CONNECTOR_MODULE = "vllm_uma.kv_offload.connector"
# kv_connector_extra_config keys we act on, or pass through to vLLM's
# CPUOffloadingManager; anything else is a typo or a feature we lack.
KNOWN_EXTRA_KEYS = frozenset(
    {
        "spec_name",
        "spec_module_path",
        "cpu_bytes_to_use",
        "eviction_policy",
        "store_threshold",
        "max_tracker_size",
        "offload_prompt_only",
        # vLLM's: host-pool and disk KV events carry their tokens, block
        # size and parent, so a router can place them (docs/fleet.md).
        "self_describing_kv_events",
        "secondary_tiers",  # the disk tier, checked by disk/config.py
    }
)
SPEC_MODULE = "vllm_uma.kv_offload.spec"
POOL_SPEC = "UmaOffloadingSpec"  # L2 only
TIERED_SPEC = "UmaTieredOffloadingSpec"  # L2 + the disk tier


class OffloadingConfigError(ValueError):
    """An offloading setting the plugin cannot serve; the message has the fix."""


@dataclass(frozen=True)
class PoolSize:
    bytes: int
    reason: str  # for the log: where the size came from
    # The size is ours to choose (the user gave none): the worker sizes it
    # again once the weights and activations are measured (resize_auto_pool).
    auto: bool = False


@dataclass(frozen=True)
class OffloadPlan:
    spec_name: str  # POOL_SPEC or TIERED_SPEC
    pool: PoolSize
    disk: DiskTierConfig | None
    # What of the server's configuration shapes its KV (with a disk tier).
    namespace_inputs: NamespaceInputs | None
    warnings: tuple[str, ...]  # for the log


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


def auto_pool_size(
    per_token: int, max_model_len: int, kv_budget: int, budget_name: str = "the KV budget"
) -> PoolSize:
    """Two full-length requests of KV, at most a quarter of ``kv_budget``."""
    wanted = 2 * max_model_len * per_token
    cap = max(0, kv_budget) // 4
    if wanted <= cap:
        return PoolSize(wanted, f"KV of 2 x max_model_len={max_model_len} tokens")
    return PoolSize(
        cap, f"2 x max_model_len={max_model_len} tokens of KV, clamped to 1/4 of {budget_name}"
    )


def resize_auto_pool(vllm_config, offload: OffloadPlan | None, left: int) -> PoolSize | None:
    """The automatic pool size again, from ``left``: the budget left once the
    weights and the activations' peak are measured (the worker, before the
    engine core builds the connector). A result, not an edit of vLLM's
    config: the worker records it (pool_size.py) and the connector sizes the
    spec from it. None when the size was given by the user, or offloading is
    off."""
    if offload is None or not offload.pool.auto:
        return None
    model, cache = vllm_config.model_config, vllm_config.cache_config
    per_token = kv_bytes_per_token(model, vllm_config.parallel_config, cache.cache_dtype)
    size = auto_pool_size(
        per_token, model.max_model_len, left, "the budget left after weights and activations"
    )
    return PoolSize(size.bytes, size.reason, auto=True)


def offloading_requested(vllm_config) -> bool:
    ktc = vllm_config.kv_transfer_config
    return vllm_config.cache_config.kv_offloading_size is not None or (
        ktc is not None and ktc.kv_connector == CONNECTOR
    )


def refuse_unsupported(vllm_config) -> None:
    cache = vllm_config.cache_config
    size = cache.kv_offloading_size
    ktc = vllm_config.kv_transfer_config
    if cache.kv_offloading_backend == "lmcache":
        raise OffloadingConfigError(
            "--kv-offloading-backend lmcache is not supported by vllm-uma: use "
            "--kv-offloading-backend native (the default) or remove the flag."
        )
    if size is not None and size <= 0:
        raise OffloadingConfigError(
            f"--kv-offloading-size={size} is invalid: it must be a positive "
            f"number of GiB. Set a size, or remove the flag to turn offloading off."
        )
    if size is not None and ktc is not None and ktc.kv_connector not in (None, CONNECTOR):
        raise OffloadingConfigError(
            f"--kv-offloading-size cannot be combined with the KV connector "
            f"{ktc.kv_connector!r} named in --kv-transfer-config: remove one of them."
        )
    refuse_unknown_keys(ktc)
    refuse_model(vllm_config.model_config)
    refuse_parallelism(vllm_config)


def refuse_unknown_keys(ktc) -> None:
    extra = {} if ktc is None else ktc.kv_connector_extra_config
    unknown = sorted(set(extra) - KNOWN_EXTRA_KEYS)
    if unknown:
        raise OffloadingConfigError(
            f"unknown key(s) {unknown} in kv_connector_extra_config; the known "
            f"keys are {sorted(KNOWN_EXTRA_KEYS)}. Remove or correct them."
        )
    described = extra.get("self_describing_kv_events", False)
    if not isinstance(described, bool):
        # vLLM would read bool("false") as true.
        raise OffloadingConfigError(
            f"kv_connector_extra_config self_describing_kv_events={described!r} is "
            f"invalid: use true or false (JSON booleans, not strings)."
        )


def refuse_model(model) -> None:
    if model is None:
        return
    if model.runner_type == "pooling":
        raise OffloadingConfigError(
            "KV offloading is not supported for pooling (embedding, reward, "
            "classification) models: remove --kv-offloading-size."
        )
    info = getattr(model, "_model_info", None)
    if info is not None and info.supports_transcription:
        raise OffloadingConfigError(
            "KV offloading is not supported for speech-to-text models: remove --kv-offloading-size."
        )
    if model.is_hybrid:
        # vLLM's is_hybrid: attention beside Mamba or linear-attention layers,
        # whose state is not a prefix of blocks a restore could bring back.
        raise OffloadingConfigError(
            "KV offloading is not supported for hybrid models with Mamba or "
            "linear-attention layers (their state is not a per-block prefix): "
            "remove --kv-offloading-size."
        )
    if model.use_mla:
        raise OffloadingConfigError(
            "KV offloading is not supported for MLA models (this model uses "
            "multi-head latent attention): remove --kv-offloading-size."
        )
    # Sliding-window models (alone or beside full-attention layers, in
    # several KV cache groups) are offloaded: vLLM's connector keys every
    # group's blocks and restores only the window a request needs for its
    # sliding groups (docs/kv_offloading.md, "Sliding-window models").


def refuse_parallelism(vllm_config) -> None:
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1 or parallel.data_parallel_size > 1:
        raise OffloadingConfigError(
            f"KV offloading is not supported with pipeline or data parallelism "
            f"(--pipeline-parallel-size={parallel.pipeline_parallel_size}, "
            f"--data-parallel-size={parallel.data_parallel_size}): set both to 1 "
            f"or remove --kv-offloading-size."
        )
    backend = parallel.distributed_executor_backend
    if backend not in (None, "uni"):
        raise OffloadingConfigError(
            f"KV offloading needs the in-process executor 'uni', but the "
            f"executor is {backend!r} (tensor_parallel_size="
            f"{parallel.tensor_parallel_size}): remove --distributed-executor-backend "
            f"and use one worker, or remove --kv-offloading-size."
        )
    spec = vllm_config.speculative_config
    if spec is not None and spec.uses_draft_model():
        raise OffloadingConfigError(
            "KV offloading is not supported with draft-model speculative "
            "decoding: remove --speculative-config or --kv-offloading-size."
        )


# Block hashes that name files outliving the process: collision-resistant
# and the same in every process.
DISK_HASH_ALGOS = ("sha256", "sha256_cbor")


def refuse_weak_hash(vllm_config) -> None:
    """The disk tier names block files by vLLM's prefix hash. xxhash is 64
    bits and not collision-resistant: a prompt crafted to collide with
    another's block would be served that block's KV by every server on the
    store, for as long as the file lives (seeding it with PYTHONHASHSEED only
    makes the seed known). It is also seeded per process otherwise, so a
    restarted server could not find its blocks."""
    algo = vllm_config.cache_config.prefix_caching_hash_algo
    if algo not in DISK_HASH_ALGOS:
        raise OffloadingConfigError(
            f"--prefix-caching-hash-algo {algo} cannot name the disk tier's block "
            f"files: they outlive the process and are shared, so their names must "
            f"be collision-resistant and the same in every process. Use "
            f"--prefix-caching-hash-algo sha256 (the default) or sha256_cbor, or "
            f"remove 'secondary_tiers'."
        )


def kv_events_enabled(vllm_config) -> bool:
    events = vllm_config.kv_events_config
    return events is not None and bool(events.enable_kv_cache_events)


def translate(vllm_config, total_ram: int) -> OffloadPlan | None:
    """Point vLLM's offloading connector at our spec; None if offloading is off."""
    ktc = vllm_config.kv_transfer_config
    extra = {} if ktc is None else ktc.kv_connector_extra_config
    if not offloading_requested(vllm_config):
        if "secondary_tiers" in extra:
            raise OffloadingConfigError(
                "kv_connector_extra_config 'secondary_tiers' (the disk tier) needs "
                "the host pool: add --kv-offloading-size N (GiB), or remove "
                "'secondary_tiers'."
            )
        return None
    refuse_unsupported(vllm_config)
    if extra.get("secondary_tiers") and int(extra.get("store_threshold", 0)) >= 2:
        raise OffloadingConfigError(
            f"store_threshold={extra['store_threshold']} cannot be combined with "
            f"the disk tier ('secondary_tiers'): remove one of them."
        )
    if extra.get("secondary_tiers"):
        refuse_weak_hash(vllm_config)
    disk, warnings = parse_disk_tier(
        extra.get("secondary_tiers"), kv_events_enabled=kv_events_enabled(vllm_config)
    )
    spec_name = TIERED_SPEC if disk else POOL_SPEC
    pool = _translate_pool(vllm_config, total_ram, spec_name)
    inputs = None
    if disk is not None:
        # The engine's namespace covers them (disk/namespace_inputs.py).
        try:
            inputs = NamespaceInputs.of(namespace_inputs(vllm_config))
        except NamespaceInputsError as exc:
            raise OffloadingConfigError(str(exc)) from None
    return OffloadPlan(
        spec_name=spec_name,
        pool=pool,
        disk=disk,
        namespace_inputs=inputs,
        warnings=tuple(warnings),
    )


def _translate_pool(vllm_config, total_ram: int, spec_name: str) -> PoolSize:
    cache = vllm_config.cache_config
    ktc = vllm_config.kv_transfer_config
    if ktc is None:
        # Imported here: vllm.config is still initialising when the platform
        # module is imported.
        from vllm.config import KVTransferConfig

        ktc = vllm_config.kv_transfer_config = KVTransferConfig()
    ktc.kv_connector_extra_config.update(spec_name=spec_name, spec_module_path=SPEC_MODULE)
    ktc.kv_connector_module_path = CONNECTOR_MODULE
    if cache.kv_offloading_size is not None:
        return PoolSize(int(cache.kv_offloading_size * GiB), "--kv-offloading-size")
    extra = ktc.kv_connector_extra_config
    explicit = extra.get("cpu_bytes_to_use")
    if explicit:
        return PoolSize(int(explicit), "cpu_bytes_to_use in --kv-transfer-config")
    model = vllm_config.model_config
    per_token = kv_bytes_per_token(model, vllm_config.parallel_config, cache.cache_dtype)
    kv_budget = int(total_ram * cache.gpu_memory_utilization)
    # Provisional: a quarter of the whole budget at most; the worker sizes it
    # again from what is left after weights and activations.
    size = auto_pool_size(per_token, model.max_model_len, kv_budget)
    # vLLM's spec refuses to start without a size; the connector gives it
    # the worker's settled one (pool_size.py).
    extra["cpu_bytes_to_use"] = size.bytes
    return PoolSize(size.bytes, f"{size.reason}; at most, settled once the weights load", True)


# How long a stopping server may take to write its pending KV blocks to the
# disk tier (vLLM's --shutdown-timeout, which is 0 by default). Below what
# usually kills a process that does not stop: Kubernetes' and our test
# harness's 30 s after SIGTERM, leaving time for the tier's own stop (its
# I/O threads get up to 5 s more, for a file they are stuck on).
DISK_FLUSH_TIMEOUT_S = 20


def flush_on_stop(vllm_config, plan: OffloadPlan) -> str | None:
    """Give a stopping server time to write its pending blocks to disk.

    With vLLM's default --shutdown-timeout 0, the API server kills the engine
    at once on SIGTERM: blocks computed but not yet on disk are lost, and a
    restarted server recomputes them. A positive timeout is vLLM's drain
    mode: the engine finishes its work, offload writes included, then exits.
    Returns the line to log when the timeout was raised; None otherwise."""
    if plan.disk is None or vllm_config.shutdown_timeout > 0:
        return None
    vllm_config.shutdown_timeout = DISK_FLUSH_TIMEOUT_S
    return (
        f"KV offloading: --shutdown-timeout set to {DISK_FLUSH_TIMEOUT_S} s so that a "
        f"stopping server finishes its requests and writes their KV blocks to the disk "
        f"tier (pass --shutdown-timeout N to choose another limit)."
    )
