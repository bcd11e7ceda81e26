"""The offloading specs vLLM's OffloadingConnector loads for vllm-uma.

Named in ``kv_connector_extra_config`` by ``spec_name``/``spec_module_path``
(the platform writes both, see config.py): ``UmaOffloadingSpec`` for the
host pool alone (L2), ``UmaTieredOffloadingSpec`` when a disk tier (L3) is
configured. Our connector builds them with :func:`make_spec`, which hands
each the offloading part of the plugin's settings plan (plugin/settings_plan.py):
the disk tier and the namespace inputs the API server resolved; and the
engine's context (plugin/engine_context.py).

vLLM builds the spec twice: in the scheduler (which calls
``get_manager``) and in the worker (``get_worker``); both live in the
engine-core process, and their connectors hand both the engine's context
(plugin/engine_context.py): the worker side's mover opens the host pool
there, the scheduler side's manager borrows it.

Scheduler side: our pool manager (pool_manager.py: vLLM's
CPUOffloadingManager with the book of rows ours; for tiers, vLLM's
TieringOffloadingManager with our primary tier over our pool and our
DiskTier, our NetworkTier, or both in that order, as secondary tiers).
Worker side: our HostPoolMover, instead of vLLM's CUDA-stream worker that
refuses to run on CPU. Only chunk ids and keys cross from the scheduler to
the worker; bytes move in the worker (L1 <-> L2) and on the disk and network
tiers' threads (L2 <-> L3).
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingWorker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from vllm_uma.kv_offload import metrics
from vllm_uma.kv_offload.config import OffloadPlan
from vllm_uma.kv_offload.disk.layout import NOINDEX, Layout
from vllm_uma.kv_offload.disk.namespace import FINGERPRINTS_FILE, namespace_for, weights_fingerprint
from vllm_uma.kv_offload.mover import HostPoolMover
from vllm_uma.kv_offload.pins.pool_policy import pin_aware_policy
from vllm_uma.kv_offload.pool_manager import UmaPoolManager, UmaPrimaryTier
from vllm_uma.kv_offload.staging_store import StagingTieringManager
from vllm_uma.models.publish import default_cache_root
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.engine_context import EngineContext

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

logger = init_logger("vllm.plugins.vllm_uma.kv_offload")
# vLLM's factory logs the spec it creates; make_spec does its work, so it
# says so in the factory's own words.
factory_logger = init_logger("vllm.v1.kv_offload.factory")


def check_layout(spec: CPUOffloadingSpec) -> None:
    if spec.blocks_per_chunk != 1:
        raise ValueError(
            f"blocks_per_chunk={spec.blocks_per_chunk}: vllm-uma offloads one "
            f"KV block per pool row. Remove 'block_size'/'blocks_per_chunk' "
            f"from kv_connector_extra_config."
        )


def make_mover(
    spec: CPUOffloadingSpec, kv_caches: CanonicalKVCaches, context: EngineContext
) -> HostPoolMover:
    """The mover over the engine's host pool, which it opens (the first
    reference) and releases at its shutdown."""
    shared = context.host_pool
    pool = shared.open(spec.num_chunks, spec.kv_bytes_per_chunk)
    try:
        return HostPoolMover(kv_caches, pool, on_shutdown=shared.release)
    except Exception:
        shared.release()
        raise


def make_spec(config, offload: OffloadPlan, context: EngineContext):
    """vLLM's ``OffloadingSpecFactory.create_spec``, with the plan's
    offloading part and the engine's context passed to our spec (vLLM's
    factory passes the config only)."""
    spec_cls = OffloadingSpecFactory.get_spec_cls(config.extra_config)
    if not issubclass(spec_cls, HostPoolWorkerMixin):
        raise ValueError(
            f"spec_name={config.extra_config.get('spec_name')!r} is not a vllm-uma spec: "
            f"remove 'spec_name' and 'spec_module_path' from kv_connector_extra_config "
            f"(the vllm-uma platform sets them)."
        )
    spec_name = config.extra_config.get("spec_name", "CPUOffloadingSpec")
    factory_logger.info("Creating offloading spec with name: %s", spec_name)
    return spec_cls(config, offload, context)


class HostPoolWorkerMixin:
    """The worker side both specs share: our mover over the engine's host
    pool, and the metrics both export.

    vLLM's get_worker refuses any platform but CUDA and XPU before it calls
    create_worker, so ours replaces it whole, and keeps the mover in the
    engine's context, where the worker-side connector finds it (vLLM's
    ``_worker`` stays None)."""

    _context: EngineContext

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]):
        # vLLM's OffloadPromMetrics registers the spec's definitions (API
        # server): ours with the pool's.
        return {**super().build_metric_definitions(extra_config), **metrics.DEFINITIONS}

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        context = self._context
        if context.mover is None:
            context.mover = make_mover(self, kv_caches, context)
        return context.mover


class UmaOffloadingSpec(HostPoolWorkerMixin, CPUOffloadingSpec):
    """L2 only: our pool manager (vLLM's, pool_manager.py) decides, our mover copies."""

    def __init__(self, config, offload: OffloadPlan | None, context: EngineContext):
        super().__init__(config)
        check_layout(self)
        self._context = context
        self._pool_manager: UmaPoolManager | None = None

    def get_manager(self) -> OffloadingManager:
        # vLLM's get_manager with our manager class, built from the same
        # settings read the same way. On a vLLM upgrade, re-read
        # CPUOffloadingSpec.get_manager: the contract records what it calls
        # (entries_offload.py) and fails this import when that changes.
        if self._pool_manager is None:
            self._pool_manager = UmaPoolManager(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
            )
        return self._pool_manager


class PoolRegion:
    """The host pool as the primary tier's ``mmap_region`` (the two calls it makes)."""

    def __init__(self, context: EngineContext):
        pool = context.host_pool.existing()
        if pool is None:
            # The worker registers its KV caches (and opens the pool) before
            # the scheduler is built; no pool here means it runs elsewhere.
            raise RuntimeError(
                "the disk tier needs the host pool in this process, but the "
                "worker has not opened it: the worker runs in another process. "
                "Remove --distributed-executor-backend (vllm-uma offloads with "
                "the in-process 'uni' executor only)."
            )
        self._shared = context.host_pool
        self._pool = self._shared.open(pool.num_rows, pool.row_bytes)

    def create_kv_memoryview(self) -> memoryview:
        return self._pool.kv_memoryview()

    def cleanup(self) -> None:
        self._shared.release()


class UmaTieredOffloadingSpec(HostPoolWorkerMixin, TieringOffloadingSpec):
    """L2 + L3: vLLM's tiering manager over our pool and our disk tier."""

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]):
        # vLLM's version looks the tier up by type, and "fs" is vLLM's own
        # tier there; ours is the DiskTier (and "valkey" is no vLLM tier).
        from vllm_uma.kv_offload.disk.tier import DiskTier

        without_tiers = {k: v for k, v in extra_config.items() if k != "secondary_tiers"}
        metrics = super().build_metric_definitions(without_tiers)
        metrics.update(DiskTier.build_metric_definitions(extra_config))
        tiers = extra_config.get("secondary_tiers") or []
        if any(isinstance(t, dict) and t.get("type") == "valkey" for t in tiers):
            from vllm_uma.kv_offload.network.tier import NetworkTier

            metrics.update(NetworkTier.build_metric_definitions(extra_config))
        return metrics

    def __init__(self, config, offload: OffloadPlan | None, context: EngineContext):
        super().__init__(config)
        check_layout(self)
        self._offload = offload
        self._tiered_manager: TieringOffloadingManager | None = None
        self._context = context

    def get_manager(self) -> OffloadingManager:
        # Replaces vLLM's get_manager, body and all (it would build vLLM's own
        # fs tier and a named shared-memory region). On a vLLM upgrade, re-read
        # TieringOffloadingSpec.get_manager: the contract records what it
        # assigns and calls (entries_offload.py) and fails this import when
        # either changes. Kept in an attribute of its own (vLLM's _manager
        # stays None).
        if self._tiered_manager is None:
            self._tiered_manager = self._build_manager()
        return self._tiered_manager

    def _build_manager(self) -> TieringOffloadingManager:
        # Resolved by the API server (checked, cap measured); read here
        # without I/O, on the scheduler side only.
        offload = self._offload
        if offload is None or offload.lower_tier is None:
            raise ValueError(
                f"{type(self).__name__} needs a disk or network tier in 'secondary_tiers', "
                f"set up by the vllm-uma platform; without one, use UmaOffloadingSpec."
            )
        namespace, fingerprint = self._namespace(offload)
        # Pins live in the disk tier's ledger; the pool keeps them through
        # a pin-aware twin of vLLM's policy (pins/pool_policy.py).
        pin_policy = None
        if offload.disk is not None:
            pin_policy = pin_aware_policy(self.eviction_policy, self.cache_policy_module_path)
        primary = UmaPrimaryTier(
            num_chunks=self.num_chunks,
            mmap_region=PoolRegion(self._context),
            cache_policy=pin_policy or self.eviction_policy,
            cache_policy_module_path=None if pin_policy else self.cache_policy_module_path,
            enable_events=self.kv_events_config.enable_kv_cache_events,
        )
        tiers = []
        try:
            # vLLM asks them in this order and stops at the first hit: disk first.
            if offload.disk is not None:
                tiers.append(self._disk_tier(primary, offload, namespace))
            if offload.network is not None:
                tiers.append(self._network_tier(primary, offload, namespace))
        except Exception:
            for tier in reversed(tiers):
                tier.shutdown()
            primary.shutdown()
            raise
        if offload.disk is not None:
            disk_tier = tiers[0]
            if offload.network is not None:  # pins kept alive in the KV server too
                tiers[1].keep_pinned(disk_tier.pinned_keys)
            if not primary.keep_pinned(disk_tier.is_pinned):
                logger.info(
                    "KV offloading: cache policy %r is not one of vLLM's (lru, arc): pinned "
                    "prefixes are kept on disk only, not in the host pool.",
                    self.eviction_policy,
                )
        logger.info(
            "KV offloading: namespace %s (weights blake3 %s...) for the %s tier(s).",
            namespace.hex,
            fingerprint[:16],
            " and ".join(tier.tier_type for tier in tiers),
        )
        # A staging pool stores only what the lower tiers lack (staging_store.py).
        staging = StagingTieringManager.applies(tiers)
        manager = StagingTieringManager if staging else TieringOffloadingManager
        return manager(primary_tier=primary, secondary_tiers=tiers)

    def _namespace(self, offload: OffloadPlan):
        """What the lower tiers file blocks under, and the weights' fingerprint."""
        if offload.disk is not None:
            noindex = offload.disk.root_dir / NOINDEX
            store = Layout(offload.disk.root_dir)
            store.ensure_store_dir()  # for the fingerprint cache
            store.close()
        else:  # the network tier alone: the cache lives with the models
            noindex = default_cache_root()
            noindex.mkdir(mode=0o700, parents=True, exist_ok=True)
        inputs = offload.namespace_inputs.values() if offload.namespace_inputs else {}
        fingerprint = weights_fingerprint(
            self.config.model.name,
            noindex / FINGERPRINTS_FILE,
            revision=inputs.get("revision"),
            download_dir=inputs.get("download_dir"),
        )
        return namespace_for(self.config, fingerprint, inputs), fingerprint

    def _disk_tier(self, primary, offload: OffloadPlan, namespace):
        from vllm_uma.kv_offload.disk.tier import DiskTier

        disk = offload.disk
        tier = DiskTier(
            self,
            primary.get_kv_memoryview(),
            "fs",
            settings=disk,
            namespace_id=namespace.id,
            namespace_info=namespace.info,
        )
        logger.info(
            "KV offloading: disk tier, KV events %s.", "on" if disk.enable_kv_events else "off"
        )
        return tier

    def _network_tier(self, primary, offload: OffloadPlan, namespace):
        from vllm_uma.kv_offload.network.tier import NetworkTier

        return NetworkTier(
            self,
            primary.get_kv_memoryview(),
            "valkey",
            settings=offload.network,
            namespace_id=namespace.id,
            namespace_info=namespace.info,
        )
