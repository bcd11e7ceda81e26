"""What KV offloading refuses, each in one line with the value and the fix.

Runs in the API server, in the platform's ``check_and_update_config``
(through config.py's ``translate``), before any weights load; what needs no
vLLM config (the flags, the extra keys) runs earlier too, in ``vllm-uma
serve``'s preflight, before vLLM is imported (commands/preflight_config.py): a setting the
host pool or the disk tier cannot serve fails start-up here, never a request
later. The flags themselves (backend, size, connector, the keys of
``kv_connector_extra_config``), the models and the parallelism offloading
does not support, and what a disk tier adds (the pool beneath it, no
``store_threshold``, a collision-resistant block hash).
"""

from __future__ import annotations

from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

# vLLM's offloading connector: the name --kv-offloading-size gives the
# connector (ours, found through config.py's CONNECTOR_MODULE), and the one
# KV connector the flag can be combined with.
CONNECTOR = "OffloadingConnector"
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
        # The disk and network tiers: tier_list.py, disk/settings.py, network/settings.py.
        "secondary_tiers",
    }
)
# Block hashes that name files outliving the process: collision-resistant
# and the same in every process.
DISK_HASH_ALGOS = ("sha256", "sha256_cbor")


class OffloadingConfigError(ValueError):
    """An offloading setting the plugin cannot serve; the message has the fix."""


def refuse_unsupported(vllm_config) -> None:
    cache = vllm_config.cache_config
    ktc = vllm_config.kv_transfer_config
    refuse_flags(
        cache.kv_offloading_backend,
        cache.kv_offloading_size,
        None if ktc is None else ktc.kv_connector,
    )
    refuse_unknown_keys({} if ktc is None else ktc.kv_connector_extra_config)
    refuse_model(vllm_config.model_config)
    refuse_parallelism(vllm_config)


def refuse_flags(backend: str | None, size: float | None, connector: str | None) -> None:
    """The offloading flags themselves (None: not given). Needs no vLLM
    config, so ``vllm-uma serve``'s preflight runs it too."""
    if backend == "lmcache":
        raise OffloadingConfigError(
            "--kv-offloading-backend lmcache is not supported by vllm-uma: use "
            "--kv-offloading-backend native (the default) or remove the flag."
        )
    if size is not None and size <= 0:
        raise OffloadingConfigError(
            f"--kv-offloading-size={size} is invalid: it must be a positive "
            f"number of GiB. Set a size, or remove the flag to turn offloading off."
        )
    if size is not None and connector not in (None, CONNECTOR):
        raise OffloadingConfigError(
            f"--kv-offloading-size cannot be combined with the KV connector "
            f"{connector!r} named in --kv-transfer-config: remove one of them."
        )


def refuse_unknown_keys(extra: dict) -> None:
    """``extra`` is ``kv_connector_extra_config``."""
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


def refuse_disk_tier_without_pool(extra: dict) -> None:
    """With offloading off: a disk tier alone has no pool to sit behind."""
    if "secondary_tiers" in extra:
        raise OffloadingConfigError(
            "kv_connector_extra_config 'secondary_tiers' (the disk and network tiers) "
            "needs the host pool: add --kv-offloading-size N (GiB), or name the connector "
            '("kv_connector": "OffloadingConnector" in --kv-transfer-config) for a '
            "pool the server sizes as their staging area, or remove "
            "'secondary_tiers'."
        )


def refuse_disk_tier_conflicts(vllm_config, extra: dict) -> None:
    """What a configured disk tier cannot be combined with."""
    if not extra.get("secondary_tiers"):
        return
    if int(extra.get("store_threshold", 0)) >= 2:
        raise OffloadingConfigError(
            f"store_threshold={extra['store_threshold']} cannot be combined with "
            f"the disk tier ('secondary_tiers'): remove one of them."
        )
    refuse_weak_hash(vllm_config)


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
