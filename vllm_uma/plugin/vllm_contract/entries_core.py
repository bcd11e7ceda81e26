"""Contract entries of the worker, the platform, the KV memory release and the command line.

Entries of modules that import no vLLM module themselves (l1_pages, lazy_kv,
engine_watch, namespace_inputs, kv_offload/config and refusals) are texts
read from vLLM's files, so that checking them imports nothing.
"""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract import scheduler_methods
from vllm_uma.plugin.vllm_contract.kinds import (
    Attribute,
    InstanceAttribute,
    Method,
    PublicNames,
    ReplacedBody,
    Text,
)

MANAGER = "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager"
POLICY = "vllm.v1.kv_offload.cpu.policies.base:CachePolicy"
CHUNK = "vllm.v1.kv_offload.cpu.policies.base:ChunkStatus"
EVENT = "vllm.v1.kv_offload.base:OffloadingEvent"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
TIERING = "vllm.v1.kv_offload.tiering.manager:TieringOffloadingManager"
BLOCK_POOL = "vllm.v1.core.block_pool:BlockPool"
FREE_QUEUE = "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue"
BLOCK = "vllm.v1.core.kv_cache_utils:KVCacheBlock"
CPU_WORKER = "vllm.v1.worker.cpu_worker:CPUWorker"
MODEL_CONFIG_FILE = "vllm.config.model"

ROWS = ("vllm_uma.memory_release.pool_rows",)
RELEASE = ("vllm_uma.memory_release.scheduler",)
BLOCKS = ("vllm_uma.memory_release.l1_blocks",)
WORKER = ("vllm_uma.plugin.worker",)
LAZY = ("vllm_uma.plugin.lazy_kv",)
WATCH = ("vllm_uma.commands.engine_watch",)
NAMESPACE = ("vllm_uma.kv_offload.disk.namespace_inputs",)
OFFLOAD_CONFIG = ("vllm_uma.kv_offload.config",)
OFFLOAD_REFUSALS = ("vllm_uma.kv_offload.refusals",)
TIER_REPORTS = ("vllm_uma.kv_offload.disk.reports",)
LIFELINE = ("vllm_uma.lifeline",)
ENGINE_CORE_FILE = "vllm.v1.engine.core"

# ModelConfig fields of vLLM 0.32.0 that can change the weights or the code
# computing the KV: the contract checks each is a field, and the disk tier's
# namespace reads them from here (disk/namespace_inputs.py), the one list.
NAMESPACE_MODEL_FIELDS = (
    "hf_config_path",
    "code_revision",
    "model_impl",
    "config_format",
    "quantization_config",
    "model_class_overrides",
)

ENTRIES = (
    # -- memory_release/pool_rows.py: evicts pool rows the way the manager does
    InstanceAttribute(MANAGER, "_num_allocated_chunks", ROWS, "the allocation mark"),
    InstanceAttribute(MANAGER, "_free_list", ROWS, "rows holding no block"),
    InstanceAttribute(MANAGER, "_policy", ROWS, "the cache policy: idle rows, LRU order"),
    InstanceAttribute(MANAGER, "_num_evictable_cache_chunks", ROWS, "kept right on eviction"),
    InstanceAttribute(MANAGER, "events", ROWS, "where an eviction is announced"),
    InstanceAttribute(MANAGER, "medium", ROWS, "the medium of that announcement"),
    Method(MANAGER, "_free_chunk", ROWS, "returns an evicted row to the free list", ("chunk",)),
    Text(
        MANAGER,
        "prepare_store",
        ROWS,
        "PoolRows.evict mirrors the manager's own eviction step",
        text="self._num_evictable_cache_chunks -= len(evicted)",
    ),
    Text(
        MANAGER,
        "prepare_store",
        ROWS,
        "PoolRows.evict mirrors the manager's own eviction step",
        text="self._free_chunk(chunk)",
    ),
    Method(POLICY, "evict", ROWS, "takes idle rows, LRU first", ("n", "protected")),
    Method(POLICY, "get", ROWS, "does the pool hold a key", ("key",)),
    InstanceAttribute(
        "vllm.v1.kv_offload.cpu.policies.lru:LRUCachePolicy",
        "chunks",
        ROWS,
        "read with a default (ARC has none): a rename would silently evict nothing",
    ),
    Attribute(CHUNK, "ref_cnt", ROWS, "0 means idle"),
    Attribute(CHUNK, "chunk_id", ROWS, "the row number"),
    Attribute(CHUNK, "is_ready", ROWS, "written and readable"),
    Attribute(EVENT, "keys", ROWS + TIER_REPORTS, "built by keyword"),
    Attribute(EVENT, "medium", ROWS + TIER_REPORTS, "built by keyword"),
    Attribute(EVENT, "removed", ROWS + TIER_REPORTS, "built by keyword"),
    Attribute(EVENT, "locality", TIER_REPORTS, "built by keyword"),
    Attribute(EVENT, "ownership", TIER_REPORTS, "built by keyword"),
    # -- memory_release/scheduler.py: the release lock over vLLM's Scheduler
    PublicNames(
        SCHEDULER,
        "",
        RELEASE,
        "each public method is reviewed: locked or not (scheduler_methods.py)",
        names=frozenset(scheduler_methods.LOCKED) | frozenset(scheduler_methods.UNLOCKED),
    ),
    PublicNames(
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler",
        "",
        RELEASE,
        "each public method is reviewed: locked or not (scheduler_methods.py)",
        names=frozenset(scheduler_methods.LOCKED) | frozenset(scheduler_methods.UNLOCKED),
    ),
    Method(SCHEDULER, "add_request", RELEASE, "overridden: notes activity", ("request",)),
    Method(SCHEDULER, "shutdown", RELEASE, "overridden: stops the release thread first", ()),
    Method(SCHEDULER, "has_requests", RELEASE, "idle means no request", ()),
    InstanceAttribute(SCHEDULER, "connector", RELEASE, "the offloading connector, if any"),
    InstanceAttribute(SCHEDULER, "kv_cache_manager", RELEASE, "its block_pool is L1"),
    InstanceAttribute(
        TIERING,
        "primary_tier",
        RELEASE,
        "read with a default: a rename would give back rows of the wrong object",
    ),
    InstanceAttribute(
        TIERING,
        "secondary_tiers",
        RELEASE,
        "read with a default: a rename would forget the disk tier's holds",
    ),
    # -- memory_release/l1_blocks.py: takes free blocks out of vLLM's prefix cache
    Method(
        BLOCK_POOL, "evict_blocks", BLOCKS, "drops blocks from the prefix cache", ("block_ids",)
    ),
    InstanceAttribute(BLOCK_POOL, "blocks", BLOCKS, "every block by id"),
    InstanceAttribute(BLOCK_POOL, "free_block_queue", BLOCKS, "free blocks, eviction order"),
    Method(FREE_QUEUE, "get_all_free_blocks", BLOCKS, "free blocks, LRU first", ()),
    Method(FREE_QUEUE, "remove", BLOCKS, "moves a given-back block", ("block",)),
    Method(FREE_QUEUE, "prepend_n", BLOCKS, "to the front: reused first", ("blocks",)),
    Attribute(BLOCK, "ref_cnt", BLOCKS, "in use when > 0"),
    Attribute(BLOCK, "is_null", BLOCKS, "the null block is never given back"),
    Attribute(BLOCK, "block_id", BLOCKS, "the block's id"),
    Attribute(BLOCK, "block_hash", BLOCKS, "cached when set"),
    # -- memory_release/l1_pages.py (imports no vLLM module: a text)
    Text(
        "vllm.v1.kv_cache_interface",
        "",
        ("vllm_uma.memory_release.l1_pages",),
        "read with a default: a rename would map every layer of a uniform group wrongly",
        text="    kv_cache_specs: dict[str, KVCacheSpec]",
    ),
    # -- plugin/worker.py: UmaWorker skips CPUWorker.__init__
    ReplacedBody(
        CPU_WORKER,
        "__init__",
        WORKER,
        "UmaWorker.__init__ binds the memory node and calls Worker.__init__ itself, without "
        "the free-RAM check; requested_cpu_memory is read only by the "
        "determine_available_memory we override",
        assigns=frozenset({"requested_cpu_memory", "parallel_config.disable_custom_all_reduce"}),
        calls=frozenset(
            {
                "ValueError",
                "format_gib",
                "get_allowed_cpu_list",
                "get_memory_node_info",
                "get_visible_memory_node",
                "logger.warning",
                "math.ceil",
                "super",
                "super().__init__",
                "torch.ops._C.init_cpu_memory_env",
            }
        ),
    ),
    Method(
        "vllm.v1.worker.gpu_worker:Worker",
        "__init__",
        WORKER,
        "called in place of CPUWorker.__init__",
        params=("vllm_config", "local_rank", "rank", "distributed_init_method", "is_driver_worker"),
    ),
    Method(
        CPU_WORKER,
        "load_model",
        WORKER,
        "overridden: measures and wires the weights",
        ("load_dummy_weights",),
    ),
    Method(CPU_WORKER, "determine_available_memory", WORKER, "overridden: our budget", ()),
    Method(
        CPU_WORKER,
        "initialize_from_config",
        WORKER,
        "overridden: lazy KV, page map",
        ("kv_cache_config",),
    ),
    Method(CPU_WORKER, "shutdown", WORKER, "overridden: closes the page map first", ()),
    Method(CPU_WORKER, "_should_warm_up_model", WORKER, "our budget warms up as vLLM's", ()),
    Method(
        CPU_WORKER,
        "_maybe_get_memory_pool_context",
        WORKER,
        "overridden (private): the lazy KV allocation runs inside it",
        ("tag",),
    ),
    Method(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner",
        "warming_up_model",
        WORKER,
        "called as CPUWorker's determine_available_memory does",
        (),
    ),
    InstanceAttribute(
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner",
        "kv_caches",
        WORKER,
        "read with a default: a rename would turn the KV release off",
    ),
    # -- plugin/lazy_kv.py (imports no vLLM module: texts)
    Text(
        "vllm.v1.worker.gpu_worker",
        "",
        LAZY + WORKER,
        "the KV cache is allocated inside this context, which UmaWorker makes lazy",
        text='self._maybe_get_memory_pool_context(tag="kv_cache")',
    ),
    Text(
        "vllm.v1.worker.utils",
        "",
        LAZY,
        "the one torch.zeros LazyZerosMode turns into torch.empty",
        text="buf = torch.zeros(buf_size, dtype=torch.int8, device=device)",
    ),
    # -- plugin/platform.py
    Text(
        "vllm.platforms.cpu:CpuPlatform",
        "check_and_update_config",
        ("vllm_uma.plugin.platform",),
        "keep_single_worker_in_process undoes this switch of a single worker",
        text='parallel_config.distributed_executor_backend = "mp"',
    ),
    # -- lifeline.py: how an orphaned engine core may be stopped (texts)
    Text(
        ENGINE_CORE_FILE,
        "",
        LIFELINE,
        "the engine core's own SIGTERM handler, which _stop_engine_core calls",
        text="signal.signal(signal.SIGTERM, signal_handler)",
    ),
    Text(
        ENGINE_CORE_FILE,
        "",
        LIFELINE,
        "that handler only records the request (safe to call from a thread)",
        text="shutdown_requested = True",
    ),
    Text(
        ENGINE_CORE_FILE,
        "",
        LIFELINE,
        "SIG_DFL before the teardown: no signal may reach it then",
        text="signal.signal(signal.SIGTERM, signal.SIG_DFL)",
    ),
    # -- commands/engine_watch.py: vLLM's log lines it matches (texts)
    Text(
        "vllm.v1.engine.core_client",
        "",
        WATCH,
        "MONITOR_LINE: the engine core died",
        text="engine core exited unexpectedly",
    ),
    Text(
        "vllm.entrypoints.launchers.launcher",
        "",
        WATCH,
        "STOP_LINE: a stop was asked for, the engine's exit is no crash",
        text="[shutdown] API server: shutdown triggered",
    ),
    Text(
        "vllm.v1.engine.exceptions",
        "",
        WATCH,
        "ENGINE_DEAD: the exception vLLM logs when the engine died",
        text="class EngineDeadError(",
    ),
    # -- kv_offload/refusals.py and config.py (import vLLM lazily: texts)
    Text(
        "vllm.config.vllm",
        "",
        OFFLOAD_REFUSALS + OFFLOAD_CONFIG,
        "vLLM names the connector after our hook; we keep its name (CONNECTOR)",
        text='config_connector = "OffloadingConnector"',
    ),
    Text(
        MODEL_CONFIG_FILE,
        "",
        OFFLOAD_REFUSALS,
        "refuse_model reads it with a default: a rename would serve speech-to-text models",
        text="self._model_info = ",
    ),
    *(
        Text(module, "", OFFLOAD_REFUSALS, "KNOWN_EXTRA_KEYS passes it to vLLM", text=f'"{key}"')
        for module, key in (
            ("vllm.config.vllm", "cpu_bytes_to_use"),
            ("vllm.v1.kv_offload.cpu.spec", "eviction_policy"),
            ("vllm.v1.kv_offload.cpu.spec", "store_threshold"),
            ("vllm.v1.kv_offload.cpu.spec", "max_tracker_size"),
            ("vllm.v1.kv_offload.base", "offload_prompt_only"),
            ("vllm.v1.kv_offload.base", "self_describing_kv_events"),
            ("vllm.v1.kv_offload.tiering.spec", "secondary_tiers"),
        )
    ),
    # -- kv_offload/disk/namespace_inputs.py: ModelConfig fields read with a default
    *(
        Text(
            MODEL_CONFIG_FILE,
            "",
            NAMESPACE,
            f"ModelConfig.{field}, read with a default: a rename would drop it from the "
            f"disk tier's namespace, and two configurations could share KV",
            text=f"    {field}: ",
        )
        for field in NAMESPACE_MODEL_FIELDS
    ),
)
