"""The unified-memory platform: vLLM's CPU platform with RAM as device memory.

Extension point: ``vllm.platform_plugins`` resolves to :class:`UmaPlatform`,
which subclasses ``vllm.platforms.cpu.CpuPlatform`` so that vLLM's CPU kernels,
attention backend and worker keep doing the compute. Out-of-tree platforms win
over vLLM's built-in ones, and ``current_platform.is_cpu()`` stays True, so
every CPU code path in vLLM still applies.

Process: the class is instantiated in each vLLM process (API server, engine
core, workers). Nothing crosses a process boundary here: every process reads
the same facts from the kernel.

What changes from the CPU platform, and why:
- Device memory is the machine's whole RAM (``/proc/meminfo`` via psutil).
  vLLM CPU reads the NUMA node's meminfo instead, which on the virtual
  machines we run on counts only the memory touched so far (docs/memory.md).
- One device, and no pinned memory: on one RAM there is nothing to pin for a
  faster host-to-device copy.
- The worker is :class:`vllm_uma.plugin.worker.UmaWorker`: the memory budget as a
  ceiling, a lazily allocated KV cache, wired weights (worker.py).
- A single worker runs in the engine-core process (executor ``uni``), where
  vLLM CPU would reserve a core for the frontend (``keep_single_worker_in_process``).
- Only vLLM 0.32.0 is accepted: importing this module with another version
  raises one line naming both (vllm_version.py).
- ``--dtype auto`` serves in float32 on a CPU without bf16 arithmetic (AVX2,
  AVX-512 without BF16), where vLLM's bf16 matmuls are several times
  slower (precision.py).
- ``ONEDNN_MAX_CPU_ISA`` below AVX512_CORE_BF16 on an AMX CPU with bf16 is
  refused: vLLM's kernels would abort on the first prompt (cpu_kernels.py).
- In ``vllm-uma serve``, SIGTERM and SIGINT before vLLM serves stop the
  server at once (startup_stop.py; vLLM's own handler is lost then).
- A restart loads its compiled model from vLLM's compile cache instead of
  compiling again: the backend is vllm-uma's inductor backend, whose saved
  artifact vLLM can load (compiled_model.py).
- The scheduler is vLLM's with a thread that gives free KV memory back
  (memory_release/scheduler.py), unless that is turned off.
- Every setting the plugin acts on (``--additional-config '{"vllm_uma":
  {...}}'``, the offloading flags) is validated here, in the API-server
  process, before any weights load, into one plan that the engine reads
  (settings_plan.py). vLLM runs this hook again in the engine core on the same
  config; that run reads the plan instead of parsing the flags again.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import psutil
import torch
from vllm import envs
from vllm.platforms.cpu import CpuPlatform

from vllm_uma import startup_stop
from vllm_uma.kv_offload import config as offload_config
from vllm_uma.kv_offload.pool_size import POOL_ONLY_NOTE
from vllm_uma.kv_offload.streaming_copies import stream_engine_copies
from vllm_uma.log import get_logger
from vllm_uma.plugin import block_size, precision, vllm_contract
from vllm_uma.plugin.cpu_kernels import check_onednn_cap
from vllm_uma.plugin.memory import fmt_gib
from vllm_uma.plugin.settings_plan import plan_attached, plan_for_hook
from vllm_uma.plugin.uma_settings import UmaSettings, UmaSettingsError
from vllm_uma.plugin.vllm_version import require_supported_vllm

# Every vLLM process imports this module first (through the entry point):
# another vLLM version fails here, in one line, not deep inside a request.
require_supported_vllm()
# Then the internals this module relies on (plugin/vllm_contract/).
vllm_contract.require(__name__)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = get_logger(__name__)

WORKER_QUALNAME = "vllm_uma.plugin.worker.UmaWorker"


def total_ram_bytes() -> int:
    """The machine's RAM as the kernel reports it in /proc/meminfo."""
    return int(psutil.virtual_memory().total)


def load_compiled_model_on_restart(compilation_config) -> None:
    """Name vllm-uma's inductor backend where vLLM CPU named torch's: its
    saved compile artifact then loads at the next start (compiled_model.py).
    """
    from vllm.config import CompilationMode

    trace_once = compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE
    if not trace_once or compilation_config.backend != "inductor":
        return
    from vllm_uma.plugin import compiled_model

    compilation_config.backend = compiled_model.backend_qualname()
    logger.info_once(
        "Compiling with %s (torch's inductor, for this CPU's vector ISA): the compiled "
        "model is saved in vLLM's compile cache and loaded at the next start.",
        compilation_config.backend,
    )


def keep_single_worker_in_process(parallel_config, requested_executor: str | None) -> None:
    """Undo vLLM CPU's switch of a single worker from 'uni' to 'mp'.

    vLLM CPU runs even a single worker in a process of its own ('mp') and
    binds its OpenMP threads to all cores but one, which it reserves for the
    frontend. On a 2-core machine that halves the compute: measured here on
    SmolLM2-135M, a 4,000-token prefill took 11.8 s with 'mp' and 6.3 s with
    'uni', and 128 decode steps 3.9 s against 3.2 s. With 'uni' the worker
    runs inside the engine-core process and its threads use every core.
    An explicit --distributed-executor-backend mp is kept.
    """
    if (
        requested_executor == "uni"
        and parallel_config.distributed_executor_backend == "mp"
        and parallel_config.world_size == 1
    ):
        parallel_config.distributed_executor_backend = "uni"
        logger.info_once(
            "Running the single worker inside the engine-core process "
            "(executor 'uni'), so every core computes; pass "
            "--distributed-executor-backend mp for vLLM CPU's default."
        )


RELEASING_SCHEDULERS = "vllm_uma.memory_release.scheduler"


def use_releasing_scheduler(scheduler_config, uma: UmaSettings, diffusion: bool = False) -> None:
    """vLLM's scheduler with the KV memory release thread, when it is on.

    Runs after vLLM has decided on async scheduling (the platform hook comes
    later in VllmConfig), so the matching base class is chosen here. Not for
    diffusion models: vLLM picks its own scheduler for them after this hook."""
    off = not uma.release_free_kv and uma.memory_pressure == "off" and uma.warm_kv_tokens == 0
    if off or diffusion:
        return
    chosen = scheduler_config.scheduler_cls
    if isinstance(chosen, str) and chosen.startswith(RELEASING_SCHEDULERS + "."):
        return  # the engine core runs this hook again on the same config
    if chosen is not None:
        raise UmaSettingsError(
            f"--scheduler-cls {scheduler_config.scheduler_cls!r} replaces the scheduler "
            f"vllm-uma gives KV memory back from. Remove --scheduler-cls, or turn the "
            f"release and the warm reserve off: --additional-config "
            f'\'{{"vllm_uma": {{"release_free_kv": false, "memory_pressure": "off", '
            f'"warm_kv_tokens": 0}}}}\'.'
        )
    name = "UmaAsyncScheduler" if scheduler_config.async_scheduling else "UmaScheduler"
    scheduler_config.scheduler_cls = f"{RELEASING_SCHEDULERS}.{name}"


class UmaPlatform(CpuPlatform):
    """vLLM's CPU platform, accounting memory as one unified RAM."""

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "cpu"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return total_ram_bytes()

    @classmethod
    def device_count(cls) -> int:
        # Unified memory: one device, whatever the NUMA layout says.
        return 1

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # What --dtype auto resolves to: float32 alone on a CPU without
        # bf16 arithmetic (precision.py).
        return precision.supported_dtypes(super().supported_dtypes, precision.has_bf16_arithmetic())

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        # vLLM's own "Platform plugin uma is activated" line is emitted while
        # the platform resolves, before vLLM configures logging, so it never
        # shows. This runs in the API server once logging is set up.
        logger.info_once(
            "vllm-uma platform plugin activated: device memory is the "
            "machine's RAM (%.1f GiB), 1 device, no pinned memory.",
            total_ram_bytes() / 2**30,
        )
        # Checked here, in the API server, before any weights load; read
        # back when vLLM runs the hook again (settings_plan.py).
        if vllm_config.model_config is not None:
            check_onednn_cap(vllm_config.model_config.dtype)
            dtype = vllm_config.model_config.dtype
            # Once, in the API server: the engine core runs this hook again
            # on the config the API server planned (settings_plan.py).
            if not plan_attached(vllm_config) and (
                note := precision.auto_note(
                    dtype, precision.has_bf16_arithmetic(), precision.dtype_given(sys.argv)
                )
            ):
                logger.info_once(note)
        # From here until vLLM serves, a stop in vllm-uma serve is honoured
        # at once (vLLM's own start-up handler is lost in its zmq polls).
        startup_stop.arm()
        settings = plan_for_hook(vllm_config, total_ram_bytes())
        plan = settings.offload
        if plan is not None:
            logger.info_once(
                "KV offloading: host pool of %s (%s).", fmt_gib(plan.pool.bytes), plan.pool.reason
            )
            if plan.lower_tier is None:
                logger.info_once(POOL_ONLY_NOTE)
            if plan.disk is not None:
                cap = plan.disk.cap_bytes
                logger.info_once(
                    "KV offloading: disk tier at %s, cap %s (%s).",
                    plan.disk.root_dir,
                    "none" if cap is None else fmt_gib(cap),
                    plan.disk.cap_reason,
                )
            if plan.network is not None:
                logger.info_once(
                    "KV offloading: network tier at %s (timeout %.1f s); the KV server's "
                    "maxmemory and policy are checked when the engine core builds it.",
                    plan.network.url,
                    plan.network.timeout_s,
                )
            for warning in plan.warnings:
                logger.warning_once(warning)
            if note := offload_config.flush_on_stop(vllm_config, plan):
                logger.info_once(note)
            # For the engine core, spawned after this hook (streaming_copies.py);
            # an engine in this very process would not see it.
            if envs.VLLM_ENABLE_V1_MULTIPROCESSING and (note := stream_engine_copies(os.environ)):
                logger.info_once(note)
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER_QUALNAME
        requested_executor = parallel_config.distributed_executor_backend
        super().check_and_update_config(vllm_config)
        if block_size.apply_default(vllm_config.cache_config):
            logger.info_once(
                "KV cache blocks of %d tokens (vLLM CPU's default is %d): a prefix hit "
                "recomputes at most %d tokens. --block-size N (a multiple of 32) sets another.",
                block_size.DEFAULT_BLOCK_TOKENS,
                block_size.VLLM_CPU_DEFAULT_BLOCK_TOKENS,
                block_size.DEFAULT_BLOCK_TOKENS - 1,
            )
        keep_single_worker_in_process(parallel_config, requested_executor)
        load_compiled_model_on_restart(vllm_config.compilation_config)
        diffusion = getattr(vllm_config, "diffusion_config", None) is not None
        use_releasing_scheduler(vllm_config.scheduler_config, settings.uma, diffusion)
