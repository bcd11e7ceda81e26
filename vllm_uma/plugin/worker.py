"""The worker: vLLM's CPU worker with the unified-memory model.

Extension point: the platform sets ``parallel_config.worker_cls`` to
:class:`UmaWorker`, which vLLM instantiates in the worker process. Nothing
here crosses a process boundary except what vLLM already sends: the KV size
returned by ``determine_available_memory`` goes to the engine core, which
turns it into a ``KVCacheConfig`` and sends it back to
``initialize_from_config``. What the scheduler side needs of the worker (the
final pool size, the L1 page map) is left in the engine's context
(engine_context.py).

Changes from ``vllm.v1.worker.cpu_worker.CPUWorker``:
- no start-up check that ``utilization x NUMA-node RAM`` is free now: the
  budget is a ceiling over the whole RAM (memory.py);
- the KV cache size is ``budget - weights - activations - pool``; an
  automatic pool's final size is chosen here, from the budget left after
  weights and activations, and recorded in the engine's context for the connectors
  (kv_offload/pool_size.py);
- the KV buffer is allocated lazily (lazy_kv.py) unless vLLM says the layout
  needs zeroing;
- the weights are locked in RAM after loading (wiring.py);
- the KV cache's page map is left for the KV memory release
  (memory_release/l1_pages.py);
- one parseable ``memory breakdown:`` line once the KV cache exists
  (worker_memory.py measures its figures);
- AMX tile permission and crash stacks for vLLM's kernels (cpu_kernels.py);
- 4-bit GPTQ linears through PyTorch's CPU int4 matmul (int4_linear.py);
- no in-place weight change (reload_weights, reset_weights, update_config)
  under a disk or network tier (kv_offload/weight_updates.py).
"""

from __future__ import annotations

import contextlib
import os
from contextlib import AbstractContextManager

import psutil
import torch
from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_visible_memory_node
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker

from vllm_uma.kv_offload.pool_size import resize_auto_pool
from vllm_uma.kv_offload.weight_updates import refuse_weight_change, tiers_named
from vllm_uma.log import get_logger
from vllm_uma.memory_release.l1_pages import L1PageMap, build_l1_page_map
from vllm_uma.plugin import int4_linear, vllm_contract
from vllm_uma.plugin.cpu_kernels import prepare_worker_process
from vllm_uma.plugin.engine_context import engine_context
from vllm_uma.plugin.lazy_kv import LazyZerosMode
from vllm_uma.plugin.memory import BudgetInputs, MemoryBudgetError, fmt_gib, kv_cache_bytes
from vllm_uma.plugin.platform import total_ram_bytes
from vllm_uma.plugin.settings_plan import read_plan
from vllm_uma.plugin.wiring import WiringResult, read_maps, unlock_range, wire_new_memory
from vllm_uma.plugin.worker_memory import (
    kv_allocation_bytes,
    memory_breakdown,
    min_request_kv_bytes,
    peak_rss,
    reset_peak_rss,
    rss,
    workers_sharing_ram,
)

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

logger = get_logger(__name__)


def _memory_node() -> int:
    """The NUMA node vLLM's CPU worker binds to (its first allowed core's)."""
    allowed_nodes = get_visible_memory_node()
    node = get_allowed_cpu_list()[0].numa_node
    return node if node in allowed_nodes else allowed_nodes[0]


class UmaWorker(CPUWorker):
    def __init__(
        self,
        vllm_config,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        # CPUWorker.__init__ binds the memory node, then refuses to start
        # unless utilization x the NUMA node's RAM is free right now. Do the
        # binding and skip the check: the budget is a ceiling (memory.py).
        # On a vLLM upgrade, re-read CPUWorker.__init__: whatever it sets up
        # beyond that must be redone here. The contract (plugin/vllm_contract/,
        # entries_core.py) records what it assigns and calls and fails this
        # import when either changes; requested_cpu_memory, which it sets and
        # we do not, is read only by the determine_available_memory we override.
        torch.ops._C.init_cpu_memory_env([_memory_node()])
        prepare_worker_process()
        Worker.__init__(
            self,
            vllm_config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
        )
        self.parallel_config.disable_custom_all_reduce = True
        self.settings = read_plan(vllm_config)
        self.uma_settings = self.settings.uma
        self.weights_bytes = 0
        self.wiring = WiringResult(0, None)
        self.budget: BudgetInputs | None = None
        self.lazy_kv = True

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        # The weights' footprint is what loading adds to the process: vLLM
        # CPU repacks linear weights into C++-owned buffers after loading,
        # so counting parameters would miss most of them (wiring.py).
        # Our 4-bit kernel is chosen, if at all, while vLLM builds the model.
        int4_linear.install(self.vllm_config.model_config.quantization)
        maps_before = read_maps()
        rss_before = rss()
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.weights_bytes = max(0, rss() - rss_before)
        # The activations are what the profile run reaches beyond this point
        # at its peak: torch frees its workspace after the run, so the RSS
        # left afterwards undercounts them (determine_available_memory).
        self.peak_window = reset_peak_rss()
        if not self.uma_settings.wire_weights:
            logger.info("Weights not wired (wire_weights is off).")
            return
        self.wiring = wire_new_memory(maps_before, self.weights_bytes)
        if self.wiring.error:
            logger.warning("Could not wire all weights: %s", self.wiring.error)
        else:
            logger.info(
                "Wired %s of weights in RAM (mlock; weights took %s).",
                fmt_gib(self.wiring.wired_bytes),
                fmt_gib(self.weights_bytes),
            )

    # Weights changed in place would keep the disk and network tiers'
    # start-up namespace: refused under them (kv_offload/weight_updates.py).
    def reload_weights(self, *args, **kwargs) -> None:
        refuse_weight_change("reload_weights", self._lower_tiers())
        super().reload_weights(*args, **kwargs)

    def reset_weights(self) -> None:
        refuse_weight_change("reset_weights", self._lower_tiers())
        super().reset_weights()

    def update_config(self, overrides) -> None:
        refuse_weight_change("update_config", self._lower_tiers())
        super().update_config(overrides)

    def _lower_tiers(self) -> str | None:
        offload = self.settings.offload
        if offload is None:
            return None
        return tiers_named(offload.disk is not None, offload.network is not None)

    def determine_available_memory(self) -> int:
        if self._should_warm_up_model():
            self.model_runner.warming_up_model()
        specs = self.model_runner.get_kv_cache_spec()
        weights = self.weights_bytes
        max_model_len = self.model_config.max_model_len
        activations = max(0, self._activation_high_water() - weights)
        total, utilization = total_ram_bytes(), self.cache_config.gpu_memory_utilization
        workers = workers_sharing_ram(self.parallel_config)
        left = int(total * utilization) // workers - weights - activations
        pool_bytes = self._final_pool(left)
        self.budget = BudgetInputs(
            total=total,
            utilization=utilization,
            weights=weights,
            activations=activations,
            kv_offload_pool=pool_bytes,
            min_kv_cache=min_request_kv_bytes(specs, self.vllm_config),
            max_model_len=max_model_len,
            workers=workers,
        )
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            # vLLM's --kv-cache-memory-bytes sizes the KV cache exactly and
            # takes precedence over the utilization, as in stock vLLM.
            logger.info("KV cache sized by --kv-cache-memory-bytes: %s.", fmt_gib(explicit))
            return explicit
        try:
            kv = kv_cache_bytes(self.budget)
        except MemoryBudgetError as exc:
            # Logged as one line: the traceback vLLM prints next is long.
            logger.error("Memory budget too small: %s", exc)
            raise
        self._warn_if_budget_exceeds_free_ram(kv)
        return kv

    def _final_pool(self, left: int) -> int:
        """The host pool's bytes: an automatic pool's final size, from ``left``,
        recorded in the engine's context for the connectors (pool_size.py),
        else the planned size."""
        offload = self.settings.offload
        pool = resize_auto_pool(self.vllm_config, offload, left)
        if pool is None:
            return self.settings.pool_bytes
        logger.info("KV offloading: host pool of %s (%s).", fmt_gib(pool.bytes), pool.reason)
        engine_context(self.vllm_config).record_pool_size(pool)
        return pool.bytes

    def _activation_high_water(self) -> int:
        """The RSS the profile run peaked at (VmHWM since the weights were
        loaded), or the RSS now where the kernel keeps no peak."""
        now = rss()
        peak = peak_rss() if getattr(self, "peak_window", False) else None
        return max(now, peak or 0)

    def _warn_if_budget_exceeds_free_ram(self, kv: int) -> None:
        available = psutil.virtual_memory().available
        if kv > available:
            logger.warning(
                "The KV cache may grow to %s but only %s of RAM is free now. "
                "It is allocated lazily, so this costs nothing until it "
                "fills; if other processes keep their memory, lower "
                "--gpu-memory-utilization to avoid running out of RAM.",
                fmt_gib(kv),
                fmt_gib(available),
            )

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.lazy_kv = not kv_cache_config.needs_kv_cache_zeroing
        rss_before = rss()
        super().initialize_from_config(kv_cache_config)
        kv_bytes = kv_allocation_bytes(kv_cache_config)
        logger.info(
            "KV cache allocated %s: %s reserved, %s resident after allocation.",
            "lazily" if self.lazy_kv else "zeroed (the layout needs zeroing)",
            fmt_gib(kv_bytes),
            fmt_gib(max(0, rss() - rss_before)),
        )
        config = self.uma_settings
        fleet = (config.fleet_member, config.fleet_size) if config.fleet_size else None
        breakdown = memory_breakdown(
            self.vllm_config,
            kv_cache_config,
            self.budget,
            self.weights_bytes,
            self.wiring.wired_bytes,
            total_ram_bytes(),
        )
        offload = self.settings.offload
        lower_tier = offload.lower_tier if offload is not None else None
        logger.info("%s", breakdown.log_line(fleet, lower_tier))
        self._keep_kv_cache_pageable()
        engine_context(self.vllm_config).l1_pages.set(self._l1_page_map(kv_cache_config))

    def _kv_caches(self) -> list[torch.Tensor]:
        """The model runner's KV cache tensors, once allocated."""
        runner = getattr(self, "model_runner", None)
        return [t for t in getattr(runner, "kv_caches", None) or [] if t is not None]

    def _keep_kv_cache_pageable(self) -> None:
        """A small KV cache can land in heap memory the weights' wiring
        locked (wiring.py): unlock its pages, so that it stays pageable and
        the KV memory release can give them back."""
        caches = self._kv_caches()
        if not caches or not self.wiring.wired_bytes:
            return
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in caches}
        errors = {unlock_range(ptr, ptr + size) for ptr, size in storages.items()} - {0}
        if errors:
            err = errors.pop()
            logger.warning(
                "Could not unlock the KV cache's pages (%s): the KV memory release "
                "may fail to give them back.",
                os.strerror(err),
            )

    def _l1_page_map(self, kv_cache_config: KVCacheConfig) -> L1PageMap | None:
        """Where each block's bytes are, for the KV memory release in the
        scheduler (memory_release/); None where the layout is not vLLM's
        one backing allocation of attention pages."""
        caches = self._kv_caches()
        groups = kv_cache_config.kv_cache_groups
        if not caches or any(not g.kv_cache_spec.has_layer_views for g in groups):
            return None
        if kv_cache_config.has_mamba_layers:
            # vLLM frees a Mamba copy-on-write source block in schedule and
            # copies from it in the next forward, outside the release lock.
            return None
        base = caches[0].untyped_storage().data_ptr()
        if any(t.untyped_storage().data_ptr() != base for t in caches):
            return None
        return build_l1_page_map(kv_cache_config, base)

    def shutdown(self) -> None:
        # Waits for a release pass in progress, and stops later ones, before
        # the KV cache is freed (memory_release/scheduler.py).
        engine_context(self.vllm_config).l1_pages.close()
        super().shutdown()

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        base = super()._maybe_get_memory_pool_context(tag)
        if tag != "kv_cache" or not self.lazy_kv:
            return base
        return _lazily(base)


@contextlib.contextmanager
def _lazily(base: AbstractContextManager):
    # Entered only around vLLM's allocate_kv_cache call, not when created.
    with base, LazyZerosMode():
        yield
