"""Contract entries of the worker, the platform, the command line and the offloading flags.

Entries of modules that import no vLLM module themselves (lazy_kv,
engine_watch, lifeline, namespace_inputs, kv_offload/config and refusals)
are texts read from vLLM's files, so that checking them imports nothing.
The KV memory release's entries are entries_release.py's.
"""

from __future__ import annotations

from vllm_uma.plugin.vllm_contract.kinds import (
    InstanceAttribute,
    Method,
    SkippedInit,
    Text,
)
from vllm_uma.plugin.vllm_contract.members import members

CPU_WORKER = "vllm.v1.worker.cpu_worker:CPUWorker"
MODEL_CONFIG_FILE = "vllm.config.model"
VLLM_CONFIG_FILE = "vllm.config.vllm"
CPU_PLATFORM = "vllm.platforms.cpu:CpuPlatform"
LAUNCHER_FILE = "vllm.entrypoints.launchers.launcher"
GPU_WORKER_FILE = "vllm.v1.worker.gpu_worker"
MODEL_RUNNER = "vllm.v1.worker.cpu_model_runner:CPUModelRunner"

WORKER = ("vllm_uma.plugin.worker",)
LAZY = ("vllm_uma.plugin.lazy_kv",)
WATCH = ("vllm_uma.commands.engine_watch",)
NAMESPACE = ("vllm_uma.kv_offload.disk.namespace_inputs",)
OFFLOAD_CONFIG = ("vllm_uma.kv_offload.config",)
OFFLOAD_REFUSALS = ("vllm_uma.kv_offload.refusals",)
LIFELINE = ("vllm_uma.lifeline",)
COMPILED = ("vllm_uma.plugin.compiled_model",)
BLOCK_SIZE = ("vllm_uma.plugin.block_size",)
PRECISION = ("vllm_uma.plugin.platform",)
ENGINE_CORE_FILE = "vllm.v1.engine.core"
WEIGHT_UPDATES = ("vllm_uma.kv_offload.weight_updates",)
ENGINE_CONTEXT = ("vllm_uma.plugin.engine_context",)

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


def _extra_keys(module: str, *keys: str) -> tuple[Text, ...]:
    """Keys of vLLM's offloading settings that refusals.KNOWN_EXTRA_KEYS lets through."""
    return tuple(
        Text(module, "", OFFLOAD_REFUSALS, "KNOWN_EXTRA_KEYS passes it to vLLM", text=f'"{key}"')
        for key in keys
    )


PIN_ROUTES = ("vllm_uma.kv_offload.pins.http_api",)

ENTRIES = (
    # -- kv_offload/pins/http_api.py: the pins routes in vLLM's API server
    # (read as text: the module imports them only when a request comes)
    Text(
        "vllm.entrypoints.serve.middleware.authenticate",
        "",
        PIN_ROUTES,
        "wraps our routes: the same API-key check as every /v1 path",
        text="def __init__(self, app: ASGIApp, tokens: list[str]) -> None:",
    ),
    Text(
        "vllm.v1.metrics.prometheus",
        "",
        PIN_ROUTES,
        "the registry vLLM's /metrics serves: our pin counters go there",
        text="def get_prometheus_registry() -> CollectorRegistry:",
    ),
    Text(
        "vllm.entrypoints.launchers.api_server.app_state",
        "",
        PIN_ROUTES,
        "app.state.args (the API key, the served name) and app.state.vllm_config (our plan)",
        text="state.args = args",
    ),
    # -- plugin/worker.py: UmaWorker skips CPUWorker.__init__
    SkippedInit(
        CPU_WORKER,
        "__init__",
        WORKER,
        "UmaWorker.__init__ binds the memory node and calls Worker.__init__ itself, without "
        "the free-RAM check; requested_cpu_memory is read only by the "
        "determine_available_memory we override",
        upstream="CPUWorker.__init__'s free-RAM check in a method of its own "
        "(a subclass with its own memory budget overrides it)",
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
    members(
        CPU_WORKER,
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
        *(
            Method(
                CPU_WORKER,
                name,
                WORKER,
                "overridden: refused under a disk or network tier (kv_offload/weight_updates.py); "
                "a rename would let it change the weights under the start-up namespace",
                params,
            )
            for name, params in (
                ("reload_weights", ("args", "kwargs")),
                ("reset_weights", ()),
                ("update_config", ("overrides",)),
            )
        ),
        Method(CPU_WORKER, "_should_warm_up_model", WORKER, "our budget warms up as vLLM's", ()),
        Method(
            CPU_WORKER,
            "_maybe_get_memory_pool_context",
            WORKER,
            "overridden (private): the lazy KV allocation runs inside it",
            ("tag",),
        ),
    ),
    members(
        MODEL_RUNNER,
        Method(
            MODEL_RUNNER,
            "warming_up_model",
            WORKER,
            "called as CPUWorker's determine_available_memory does",
            (),
        ),
        InstanceAttribute(
            MODEL_RUNNER,
            "kv_caches",
            WORKER,
            "read with a default: a rename would turn the KV release off",
        ),
    ),
    # -- plugin/lazy_kv.py (imports no vLLM module: texts) and kv_offload/weight_updates.py
    members(
        GPU_WORKER_FILE,
        Text(
            GPU_WORKER_FILE,
            "",
            LAZY + WORKER,
            "the KV cache is allocated inside this context, which UmaWorker makes lazy",
            text='self._maybe_get_memory_pool_context(tag="kv_cache")',
        ),
        Text(
            GPU_WORKER_FILE,
            "",
            WEIGHT_UPDATES,
            "without a weight-transfer config the worker has no engine, and update_weights fails",
            text="        if self.vllm_config.weight_transfer_config is not None:\n"
            "            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(",
        ),
    ),
    Text(
        "vllm.v1.worker.utils",
        "",
        LAZY,
        "the one torch.zeros LazyZerosMode turns into torch.empty",
        text="buf = torch.zeros(buf_size, dtype=torch.int8, device=device)",
    ),
    # -- plugin/engine_context.py: both sides of an engine core meet on one VllmConfig (texts)
    Text(
        "vllm.v1.executor.uniproc_executor",
        "",
        ENGINE_CONTEXT,
        "the 'uni' executor hands the worker the engine core's own VllmConfig, "
        "which the scheduler gets too: the engine's context rides on it",
        text="vllm_config=self.vllm_config,",
    ),
    # -- plugin/platform.py, compiled_model.py, block_size.py: vLLM CPU's config hook
    members(
        CPU_PLATFORM,
        Text(
            CPU_PLATFORM,
            "check_and_update_config",
            ("vllm_uma.plugin.platform",),
            "keep_single_worker_in_process undoes this switch of a single worker",
            text='parallel_config.distributed_executor_backend = "mp"',
        ),
        Text(
            CPU_PLATFORM,
            "check_and_update_config",
            COMPILED,
            "vLLM CPU's compiled mode is one Dynamo trace with torch's inductor named by "
            "string; the platform swaps that string for our backend's name",
            text="compilation_config.mode = CompilationMode.DYNAMO_TRACE_ONCE",
        ),
        Text(
            CPU_PLATFORM,
            "check_and_update_config",
            BLOCK_SIZE,
            "without --block-size, vLLM CPU sets 128 in its config hook (after its MLA and "
            "DeepSeek-V4 cases): block_size.apply_default replaces that 128 right after",
            text="elif not cache_config.user_specified_block_size:\n"
            "            cache_config.block_size = 128",
        ),
    ),
    # -- VllmConfig's file: settings_plan.py, kv_offload/refusals.py, config.py and
    # weight_updates.py (texts)
    members(
        VLLM_CONFIG_FILE,
        Text(
            VLLM_CONFIG_FILE,
            "",
            ("vllm_uma.plugin.settings_plan",),
            "additional_config is hashed into the compile-cache key: only a constant marker there",
            text="json.dumps(additional_config, sort_keys=True)",
        ),
        Text(
            VLLM_CONFIG_FILE,
            "",
            OFFLOAD_REFUSALS + OFFLOAD_CONFIG,
            "vLLM names the connector after our hook; we keep its name (CONNECTOR)",
            text='config_connector = "OffloadingConnector"',
        ),
        Text(
            VLLM_CONFIG_FILE,
            "",
            OFFLOAD_REFUSALS,
            "KNOWN_EXTRA_KEYS passes it to vLLM",
            text='"cpu_bytes_to_use"',
        ),
        Text(
            VLLM_CONFIG_FILE,
            "",
            WEIGHT_UPDATES + OFFLOAD_CONFIG,
            "translate reads VllmConfig.weight_transfer_config: a rename would let "
            "update_weights run under the tiers",
            text="weight_transfer_config: WeightTransferConfig | None = None",
        ),
    ),
    # -- commands/kv_events_endpoint.py: the private default socket (texts)
    Text(
        "vllm.distributed.kv_events",
        "",
        ("vllm_uma.commands.kv_events_endpoint",),
        "vLLM's publisher binds an ipc:// endpoint, so subscribers connect to its path",
        text='endpoint.startswith(("ipc://", "inproc://"))',
    ),
    # -- lifeline.py: how an orphaned engine core may be stopped (texts)
    members(
        ENGINE_CORE_FILE,
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
    ),
    # -- plugin/cpu_kernels.py: why a low oneDNN cap aborts on AMX (texts)
    Text(
        "vllm.model_executor.layers.utils",
        "",
        ("vllm_uma.plugin.cpu_kernels",),
        "bf16 linear kernels are chosen by the CPU's AMX tiles, not by oneDNN's cap",
        text="if not torch.cpu._is_amx_tile_supported() or dtype not in (",
    ),
    # -- startup_stop.py: vLLM's start-up handler, then serving's (texts)
    Text(
        "vllm.entrypoints.launchers.api_server.entry",
        "",
        ("vllm_uma.startup_stop",),
        "vLLM puts its start-up SIGTERM handler in before building the config, so ours "
        "(from the platform hook) comes after it",
        text="signal.signal(signal.SIGTERM, _interrupt_init)",
    ),
    # -- startup_stop.py and commands/engine_watch.py: serving's handlers and log line
    members(
        LAUNCHER_FILE,
        Text(
            LAUNCHER_FILE,
            "",
            ("vllm_uma.startup_stop",),
            "serving replaces our handlers with vLLM's own (graceful: the disk tier drains)",
            text="loop.add_signal_handler(signal.SIGTERM, signal_handler)",
        ),
        Text(
            LAUNCHER_FILE,
            "",
            ("vllm_uma.startup_stop",),
            "and so for SIGINT",
            text="loop.add_signal_handler(signal.SIGINT, signal_handler)",
        ),
        Text(
            LAUNCHER_FILE,
            "",
            WATCH,
            "STOP_LINE: a stop was asked for, the engine's exit is no crash",
            text="[shutdown] API server: shutdown triggered",
        ),
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
        "vllm.v1.engine.exceptions",
        "",
        WATCH,
        "ENGINE_DEAD: the exception vLLM logs when the engine died",
        text="class EngineDeadError(",
    ),
    # -- kv_offload/refusals.py (imports vLLM lazily: texts): KNOWN_EXTRA_KEYS
    members(
        "vllm.v1.kv_offload.cpu.spec",
        *_extra_keys(
            "vllm.v1.kv_offload.cpu.spec", "eviction_policy", "store_threshold", "max_tracker_size"
        ),
    ),
    members(
        "vllm.v1.kv_offload.base",
        *_extra_keys("vllm.v1.kv_offload.base", "offload_prompt_only", "self_describing_kv_events"),
    ),
    Text(
        "vllm.v1.kv_offload.tiering.spec",
        "",
        OFFLOAD_REFUSALS,
        "KNOWN_EXTRA_KEYS passes it to vLLM",
        text='"secondary_tiers"',
    ),
    # -- kv_offload/weight_updates.py: what lets weights change at run time (texts)
    Text(
        "vllm.envs",
        "",
        WEIGHT_UPDATES,
        "dev_mode_on reads the variable as vLLM does",
        text='"VLLM_SERVER_DEV_MODE": lambda: bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))',
    ),
    Text(
        "vllm.entrypoints.launchers.api_server.routers",
        "",
        WEIGHT_UPDATES,
        "the development endpoints (/collective_rpc, the RL weight updates) exist only in dev mode",
        text="    if envs.VLLM_SERVER_DEV_MODE:\n"
        "        from vllm.entrypoints.serve import register_vllm_dev_api_routers",
    ),
    # -- plugin/compiled_model.py: the backend whose AOT artifact vLLM can load
    Text(
        "vllm.config.compilation",
        "",
        COMPILED,
        "init_backend resolves a backend by qualified name in DYNAMO_TRACE_ONCE mode "
        "(our name carries the CPU's vector ISA into the compile-cache key)",
        text="return resolve_obj_by_qualname(self.backend)",
    ),
    Text(
        "vllm.compilation.decorators",
        "",
        COMPILED,
        "the AOT loader calls this on the loaded artifact: InductorArtifact provides it",
        text="loaded_fn._artifacts.compiled_fn.finalize_loading(model.vllm_config)",
    ),
    # -- ModelConfig's file: kv_offload/refusals.py, plugin/precision.py (how vLLM
    # resolves --dtype auto) and kv_offload/disk/namespace_inputs.py (fields read with
    # a default)
    members(
        MODEL_CONFIG_FILE,
        Text(
            MODEL_CONFIG_FILE,
            "",
            OFFLOAD_REFUSALS,
            "refuse_model reads it with a default: a rename would serve speech-to-text models",
            text="self._model_info = ",
        ),
        Text(
            MODEL_CONFIG_FILE,
            "",
            PRECISION,
            "--dtype auto takes the checkpoint's dtype if the platform lists it, else the "
            "platform's first: UmaPlatform.supported_dtypes lists float32 alone without bf16 "
            "arithmetic",
            text="        for dtype in current_platform.supported_dtypes\n",
        ),
        Text(
            MODEL_CONFIG_FILE,
            "",
            PRECISION,
            "an explicit --dtype is not checked against the platform's list (bf16 stays servable)",
            text="            torch_dtype = _STR_DTYPE_TO_TORCH_DTYPE[dtype]",
        ),
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
    ),
    # -- plugin/block_size.py: where vLLM CPU picks its general default block
    Text(
        "vllm.config.cache",
        "",
        BLOCK_SIZE,
        "CacheConfig records whether --block-size was given: apply_default reads it",
        text="user_specified_block_size: bool = field(default=False, init=False)",
    ),
    Text(
        "vllm.v1.attention.backends.cpu_attn",
        "",
        BLOCK_SIZE,
        "vLLM CPU's attention takes any multiple of 32 tokens (the default's 32 included)",
        text="return [MultipleOf(32)]",
    ),
)
