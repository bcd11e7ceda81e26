"""Contract entries of KV offloading (kv_offload/): the connector, its metrics, the specs, L3."""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract.kinds import (
    Attribute,
    Fields,
    InstanceAttribute,
    Method,
    PrivateWrite,
    ReplacedBody,
    SkippedInit,
    Text,
)
from vllm_uma.plugin.vllm_contract.members import members

OFF = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
SCHED = f"{OFF}.scheduler:OffloadingConnectorScheduler"
STATE = f"{OFF}.scheduler:RequestOffloadState"
JOB = f"{OFF}.scheduler:TransferJobStatus"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector"
PROM = f"{OFF}.metrics:OffloadPromMetrics"
TIERING_SPEC = "vllm.v1.kv_offload.tiering.spec:TieringOffloadingSpec"
PRIMARY = "vllm.v1.kv_offload.tiering.manager:CPUPrimaryTierOffloadingManager"
SECONDARY = "vllm.v1.kv_offload.tiering.base:SecondaryTierManager"
TIERING = "vllm.v1.kv_offload.tiering.manager:TieringOffloadingManager"
FACTORY = "vllm.v1.kv_offload.factory:OffloadingSpecFactory"
CPU_SPEC = "vllm.v1.kv_offload.cpu.spec:CPUOffloadingSpec"
OFFLOAD_CONFIG = f"{OFF}.scheduler:SchedulerOffloadConfig"
GROUP_STATE = f"{OFF}.scheduler:RequestGroupState"

C = ("vllm_uma.kv_offload.connector",)
RELEASE = ("vllm_uma.memory_release.scheduler",)
BOTH = C + RELEASE
M = ("vllm_uma.kv_offload.metrics",)
S = ("vllm_uma.kv_offload.spec",)
STAGING = ("vllm_uma.kv_offload.staging_store",)
T = ("vllm_uma.kv_offload.disk.tier",)
NET = ("vllm_uma.kv_offload.network.tier",)
PROBES = ("vllm_uma.kv_offload.network.probes",)
ASYNC_LOOKUP = "vllm.v1.kv_offload.tiering.async_lookup:AsyncLookupManager"

KERNEL = ("vllm_uma.kv_offload.attention_kernel",)
CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"

ENTRIES = (
    # -- kv_offload/attention_kernel.py: the kernel choice, asked the same way
    Method(
        CPU_ATTN,
        "_get_attn_isa",
        KERNEL,
        "the attention kernel of a KV cache group, part of the disk namespace",
        ("dtype", "block_size", "head_size", "kv_cache_dtype"),
    ),
    Text(
        f"{CPU_ATTN}:CPUAttentionMetadataBuilder",
        "__init__",
        KERNEL,
        "vLLM's builder chooses it from these values, as attention_kernels does",
        text="self.isa = _get_attn_isa(\n            self.dtype,\n            self.block_size,",
    ),
    # -- connector.py: UmaOffloadingConnector skips OffloadingConnector.__init__
    SkippedInit(
        CONNECTOR,
        "__init__",
        C,
        "UmaOffloadingConnector.__init__ redoes it with our scheduler side, so the spec's "
        "manager (and a disk tier) is built once; anything new here must be redone there",
        upstream="OffloadingConnector.__init__ building its spec and its scheduler side "
        "through methods a subclass overrides (as OffloadingSpec.get_worker calls "
        "create_worker): calling it now would build vLLM's spec without our settings plan, "
        "which the tiered spec refuses",
        assigns=frozenset({"_canonical_layout", "connector_scheduler", "connector_worker"}),
        calls=frozenset(
            {
                "super",
                "super().__init__",
                "build_offloading_config",
                "OffloadingSpecFactory.create_spec",
                "OffloadingConnectorScheduler",
                "OffloadingConnectorWorker",
            }
        ),
    ),
    Method(
        "vllm.distributed.kv_transfer.kv_connector.v1:KVConnectorBase_V1",
        "__init__",
        C,
        "called in place of OffloadingConnector.__init__'s super().__init__",
        params=("vllm_config", "role", "kv_cache_config"),
    ),
    Method(
        f"{OFF}.config",
        "build_offloading_config",
        C,
        "our __init__ calls it as vLLM's does",
        params=("vllm_config", "kv_cache_config"),
    ),
    # -- spec.py: make_spec redoes the factory's create_spec with the plan
    members(
        FACTORY,
        ReplacedBody(
            FACTORY,
            "create_spec",
            S,
            "make_spec redoes it, passing our spec the settings plan's offloading part; "
            "anything new here (and its log line) must be redone there",
            calls=frozenset(
                {"config.extra_config.get", "cls.get_spec_cls", "spec_cls", "logger.info"}
            ),
        ),
        Method(
            FACTORY,
            "get_spec_cls",
            S,
            "make_spec resolves spec_name/spec_module_path through it, as create_spec does",
            params=("extra_config",),
        ),
    ),
    Method(
        f"{OFF}.worker:OffloadingConnectorWorker",
        "__init__",
        C,
        "built by our __init__ for the worker role",
        params=("spec", "vllm_config", "kv_cache_config"),
    ),
    members(
        CONNECTOR,
        Method(
            CONNECTOR,
            "get_finished",
            C,
            "overridden: adds released holds; in a step with no tokens scheduled it first "
            "waits for a pending load (vLLM calls it once per step, after start_load_kv)",
            ("finished_req_ids",),
        ),
        Method(
            CONNECTOR,
            "build_prom_metrics",
            C,
            "overridden: our counters beside vLLM's",
            params=("vllm_config", "metric_types", "labelnames", "per_engine_labelvalues"),
        ),
        Method(
            CONNECTOR,
            "_get_connector_metadata",
            C,
            "get_finished reads the step's metadata for released holds and idle steps",
            params=(),
        ),
    ),
    # -- connector.py: UmaConnectorScheduler's overrides and vLLM's bookkeeping
    PrivateWrite(
        SCHED,
        "_req_status",
        C,
        "requests the connector tracks; _signal_finished forgets a released held one, "
        "as vLLM's build_connector_meta does",
        upstream="OffloadingConnectorScheduler's finished-request step of "
        "build_connector_meta as a method a subclass can call for a request it held",
    ),
    members(
        SCHED,
        Method(
            SCHED,
            "__init__",
            C,
            "UmaConnectorScheduler.__init__ passes these on",
            params=("spec", "vllm_config", "kv_cache_config"),
        ),
        Method(SCHED, "request_finished", C, "overridden: holds unstored blocks", ("request",)),
        Method(
            SCHED,
            "build_connector_meta",
            C,
            "overridden: hides held requests from finished_req_ids",
            params=("scheduler_output",),
        ),
        Method(
            SCHED,
            "_build_store_jobs",
            C,
            "overridden (private): held requests' stores first",
            params=("scheduler_output",),
        ),
        Method(SCHED, "has_pending_push_work", C, "overridden: holds keep the engine busy", ()),
        Method(SCHED, "reset_cache", C, "overridden: a reset releases the holds", ()),
        Method(
            SCHED,
            "update_connector_output",
            C,
            "overridden: counts completed stores and restores",
            params=("connector_output",),
        ),
        Method(
            SCHED,
            "_calc_num_offloadable_tokens",
            C,
            "_unstored_chunks counts what _build_store_jobs would offer",
            params=("req_status", "num_computed_tokens"),
        ),
        InstanceAttribute(SCHED, "_req_status", RELEASE, "requests the connector tracks"),
        InstanceAttribute(SCHED, "_jobs", BOTH, "transfer jobs in flight"),
        InstanceAttribute(SCHED, "_connector_stats", BOTH, "where our counters go"),
        InstanceAttribute(SCHED, "manager", BOTH, "the pool's manager (pool rows, finish signal)"),
        InstanceAttribute(SCHED, "config", C, "kv_group_configs, blocks_per_chunk"),
        InstanceAttribute(
            SCHED,
            "_block_id_to_pending_jobs",
            RELEASE,
            "L1 blocks a store still reads: the release skips them",
        ),
    ),
    members(
        OFFLOAD_CONFIG,
        Attribute(OFFLOAD_CONFIG, "kv_group_configs", C, "per-group config for storable_chunks"),
        Attribute(OFFLOAD_CONFIG, "blocks_per_chunk", C, "blocks per counted job key"),
    ),
    members(
        STATE,
        Method(
            STATE,
            "storable_chunks",
            C,
            "_unstored_chunks asks it per group",
            params=("group_config", "group_state", "num_offloadable_tokens"),
        ),
        Attribute(STATE, "req", BOTH, "the request of a tracked status"),
        Attribute(STATE, "group_states", BOTH, "per-group block ids and store progress"),
        Attribute(STATE, "req_context", C, "passed to manager.on_request_finished"),
        Attribute(STATE, "transfer_jobs", C, "jobs still running for a request"),
        Attribute(STATE, "finished_signaled", C, "set by _signal_finished as vLLM does"),
    ),
    members(
        GROUP_STATE,
        Attribute(GROUP_STATE, "next_stored_chunk_idx", C, "chunks already handed to a store"),
        Attribute(GROUP_STATE, "block_ids", RELEASE, "a request's L1 blocks"),
        Attribute(
            GROUP_STATE,
            "offload_keys",
            C,
            "a pinned request's keys, up to date after vLLM's request_finished",
        ),
    ),
    Attribute(f"{OFF}.scheduler:GroupOffloadConfig", "tokens_per_chunk", C, "a pin's full blocks"),
    InstanceAttribute(
        "vllm.v1.request:Request", "kv_transfer_params", C, "a request that asks to be pinned"
    ),
    members(
        JOB,
        Attribute(JOB, "keys", C, "blocks a completed job moved (counted)"),
        Attribute(JOB, "is_store", C, "store or load (counted apart)"),
        Attribute(JOB, "fenced_block_ids", RELEASE, "blocks a store fenced"),
        Attribute(JOB, "deferred_fence_block_ids", RELEASE, "blocks a store will fence"),
    ),
    Fields(
        f"{OFF}.common:OffloadingConnectorMetadata",
        "",
        C,
        "UmaConnectorMetadata is rebuilt from these fields one by one: a new one would be lost",
        names=("load_jobs", "store_jobs", "jobs_to_flush"),
    ),
    Attribute(
        f"{OFF}.common:OffloadingWorkerMetadata",
        "completed_jobs",
        C,
        "jobs done this step (counted)",
    ),
    Method(
        f"{OFF}.metrics:OffloadingConnectorStats",
        "increase_counter",
        BOTH,
        "our counters",
        params=("counter_name", "counter_increase_value", "labelvalues"),
    ),
    # -- metrics.py: UmaOffloadPromMetrics registers ours in vLLM's two dicts
    members(
        PROM,
        Method(
            PROM,
            "__init__",
            M,
            "UmaOffloadPromMetrics passes these on",
            params=("vllm_config", "metric_types", "labelnames", "per_engine_labelvalues"),
        ),
        Text(
            PROM,
            "__init__",
            M,
            "it registers the spec's metric definitions, ours among them (spec.py)",
            text="**spec_cls.build_metric_definitions(extra_config),",
        ),
        Method(
            PROM,
            "_get_prometheus_metric",
            M,
            "shows our counters at 0 from the start",
            params=("metric_name", "labelvalues", "engine_idx"),
        ),
    ),
    # -- staging_store.py (a staging pool stores only what the lower tiers lack) and
    # spec.py (builds the tiering manager)
    members(
        TIERING,
        Method(
            TIERING,
            "prepare_store",
            STAGING,
            "StagingTieringManager filters the keys before vLLM's prepare_store",
            params=("keys", "req_context"),
        ),
        Text(
            TIERING,
            "prepare_store",
            STAGING,
            "the pool is asked with the keys given (the filtered ones), and a key left out of "
            "keys_to_store is one the offloading side already has, to the connector",
            text="primary_result = self.primary_tier.prepare_store(keys, req_context)",
        ),
        Method(
            TIERING,
            "__init__",
            S,
            "built by _build_manager with keywords",
            params=("primary_tier", "secondary_tiers"),
        ),
    ),
    # -- spec.py: our specs over vLLM's CPU and tiering specs
    members(
        CPU_SPEC,
        ReplacedBody(
            CPU_SPEC,
            "get_manager",
            S,
            "UmaOffloadingSpec.get_manager builds our pool manager from the same settings; "
            "what vLLM's adds here must be weighed there",
            assigns=frozenset({"_manager"}),
            calls=frozenset({"CPUOffloadingManager", "int", "self.extra_config.get"}),
        ),
        Method(
            CPU_SPEC,
            "build_metric_definitions",
            S,
            "extended: our counters with the pool's",
            params=("extra_config",),
        ),
    ),
    members(
        TIERING_SPEC,
        Method(TIERING_SPEC, "get_worker", S, "overridden: our mover", ("kv_caches",)),
        Method(
            TIERING_SPEC,
            "build_metric_definitions",
            S,
            "overridden: the disk tier's metrics instead of vLLM's fs tier's",
            params=("extra_config",),
        ),
        ReplacedBody(
            TIERING_SPEC,
            "get_manager",
            S,
            "UmaTieredOffloadingSpec.get_manager builds its own tiering manager over our pool "
            "and DiskTier; what vLLM's adds here must be weighed there",
            assigns=frozenset({"_manager", "_scheduler_mmap"}),
            calls=frozenset(
                {
                    "CPUPrimaryTierOffloadingManager",
                    "SecondaryTierFactory.create_secondary_tier",
                    "SharedOffloadRegion",
                    "TieringOffloadingManager",
                    "ValueError",
                    "enumerate",
                    "int",
                    "len",
                    "logger.exception",
                    "logger.info",
                    "primary_tier.get_kv_memoryview",
                    "primary_tier.shutdown",
                    "reversed",
                    "scheduler_mmap.cleanup",
                    "secondary_tiers.append",
                    "self.extra_config.get",
                    "tier.shutdown",
                }
            ),
        ),
    ),
    members(
        PRIMARY,
        Method(
            PRIMARY,
            "__init__",
            S,
            "built by _build_manager with keywords (as UmaPrimaryTier)",
            params=(
                "num_chunks",
                "mmap_region",
                "cache_policy",
                "cache_policy_module_path",
                "enable_events",
            ),
        ),
        Method(PRIMARY, "get_kv_memoryview", S, "the rows the disk tier reads and writes", ()),
    ),
    # -- disk/tier.py and network/tier.py: DiskTier and NetworkTier are
    # SecondaryTierManagers; staging_store.py touches one
    members(
        SECONDARY,
        Method(
            SECONDARY,
            "touch",
            STAGING,
            "a dropped block is touched in the tier",
            ("keys", "req_context"),
        ),
        Method(
            SECONDARY,
            "__init__",
            T,
            "DiskTier passes these on",
            params=("offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector"),
        ),
        Method(
            SECONDARY,
            "build_metric_definitions",
            T,
            "overridden: the disk tier's metrics",
            params=("extra_config",),
        ),
        Attribute(SECONDARY, "block_size_bytes", T, "a pool row's bytes (property)"),
        Attribute(SECONDARY, "medium", T, "overridden class attribute: STORAGE"),
        InstanceAttribute(SECONDARY, "locality", T, "set to LOCAL; sent with each KV event"),
        Method(
            SECONDARY,
            "__init__",
            NET,
            "NetworkTier passes these on",
            params=("offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector"),
        ),
        Method(
            SECONDARY,
            "build_metric_definitions",
            NET,
            "overridden: the network tier's metrics",
            params=("extra_config",),
        ),
        Attribute(SECONDARY, "block_size_bytes", NET, "a pool row's bytes (property)"),
        Attribute(SECONDARY, "medium", NET, "overridden class attribute: STORAGE"),
        Attribute(
            SECONDARY,
            "cache_hit_source",
            NET,
            "overridden class attribute: EXTERNAL_UNSPECIFIED, so a network hit is no disk hit",
        ),
        InstanceAttribute(SECONDARY, "locality", NET, "set to REMOTE; a tier filter reads it"),
        Method(
            SECONDARY,
            "on_schedule_end",
            NET,
            "overridden: sends the step's lookups to the lookup thread",
            params=("context",),
        ),
    ),
    # -- network/probes.py: ServerProbes is vLLM's AsyncLookupManager; network/tier.py uses it
    members(
        ASYNC_LOOKUP,
        Method(ASYNC_LOOKUP, "__init__", PROBES, "built with the tier type", params=("tier_type",)),
        Method(
            ASYNC_LOOKUP,
            "batch_lookup",
            PROBES,
            "implemented: one pipelined EXISTS per batch, on vLLM's lookup thread",
            params=("keys", "req_context"),
        ),
        Method(
            ASYNC_LOOKUP,
            "lookup",
            NET,
            "True, False, or None (asked at the step's end: RETRY)",
            params=("key", "req_context"),
        ),
        Method(ASYNC_LOOKUP, "flush", NET, "at each step's end", ()),
        Method(ASYNC_LOOKUP, "cleanup", NET, "when a request finishes", params=("req_id",)),
        Method(
            ASYNC_LOOKUP,
            "mark_miss",
            NET,
            "a failed load's keys, or vLLM promotes them again (a livelock)",
            params=("keys",),
        ),
        Method(ASYNC_LOOKUP, "shutdown", NET, "stops the lookup thread", ()),
    ),
)
