"""Translate vLLM's offloading flags to vllm-uma's spec, or refuse them.

Runs in the API server, in the platform's ``check_and_update_config``, before
any weights load and before vLLM's own ``_post_init_kv_transfer_config``
(which then fills in the connector, ``cpu_bytes_to_use`` and ``kv_role`` from
``--kv-offloading-size`` as usual). What we add: our connector's module
(``kv_connector_module_path``), our spec's name in
``kv_connector_extra_config``, the pool size when only the connector is
named (pool_size.py sizes it), and a clear refusal for what the host pool
does not support (refusals.py) and for weights that can change at run time
under a disk or network tier (weight_updates.py).

What vLLM reads stays in ``kv_connector_extra_config``; what only we read
(whether the pool's size is ours to choose, the resolved disk tier, the
namespace inputs)
is returned in the :class:`OffloadPlan`, which travels in the plugin's one
settings plan (plugin/settings_plan.py).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from vllm_uma.kv_offload.disk.namespace_inputs import (
    NamespaceInputs,
    NamespaceInputsError,
    namespace_inputs,
)
from vllm_uma.kv_offload.disk.settings import DiskTierSettings, parse_disk_tier
from vllm_uma.kv_offload.network.settings import NetworkTierSettings, parse_network_tier
from vllm_uma.kv_offload.pool_size import PoolSize, auto_pool_size, kv_bytes_per_token
from vllm_uma.kv_offload.refusals import (
    CONNECTOR,
    OffloadingConfigError,
    refuse_disk_tier_conflicts,
    refuse_disk_tier_without_pool,
    refuse_unsupported,
)
from vllm_uma.kv_offload.tier_list import split_tiers
from vllm_uma.kv_offload.weight_updates import (
    TURN_OFF_TIERS,
    refuse_weight_updates,
    tiers_named,
)
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.memory import GiB

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

# Our subclass of vLLM's connector (no block lost when the pool is full).
# vLLM resets the connector name from --kv-offloading-size after the
# platform hook but keeps the module path, and looks the name up there.
CONNECTOR_MODULE = "vllm_uma.kv_offload.connector"
SPEC_MODULE = "vllm_uma.kv_offload.spec"
POOL_SPEC = "UmaOffloadingSpec"  # L2 only
TIERED_SPEC = "UmaTieredOffloadingSpec"  # L2 + the disk tier, the network tier or both


@dataclass(frozen=True)
class OffloadPlan:
    spec_name: str  # POOL_SPEC or TIERED_SPEC
    pool: PoolSize
    disk: DiskTierSettings | None
    # What of the server's configuration shapes its KV (with a lower tier).
    namespace_inputs: NamespaceInputs | None
    warnings: tuple[str, ...]  # for the log
    network: NetworkTierSettings | None = None

    @property
    def lower_tier(self) -> str | None:
        """The first tier below the pool (disk or network: blocks outlive the
        process, in a namespace), by the name the log gives it; None when the
        pool is the last tier (pool_size.py sizes the pool from this)."""
        if self.disk is not None:
            return "disk"
        return None if self.network is None else "network"


def offloading_requested(vllm_config) -> bool:
    ktc = vllm_config.kv_transfer_config
    return vllm_config.cache_config.kv_offloading_size is not None or (
        ktc is not None and ktc.kv_connector == CONNECTOR
    )


def kv_events_enabled(vllm_config) -> bool:
    events = vllm_config.kv_events_config
    return events is not None and bool(events.enable_kv_cache_events)


def translate(vllm_config, total_ram: int) -> OffloadPlan | None:
    """Point vLLM's offloading connector at our spec; None if offloading is off."""
    ktc = vllm_config.kv_transfer_config
    extra = {} if ktc is None else ktc.kv_connector_extra_config
    if not offloading_requested(vllm_config):
        refuse_disk_tier_without_pool(extra)
        return None
    refuse_unsupported(vllm_config)
    refuse_disk_tier_conflicts(vllm_config, extra)
    fs_tier, network_tier = split_tiers(extra.get("secondary_tiers"))
    refuse_weight_updates(
        tiers_named(fs_tier is not None, network_tier is not None),
        os.environ,
        vllm_config.weight_transfer_config is not None,
        TURN_OFF_TIERS,
    )
    disk, warnings = parse_disk_tier(
        None if fs_tier is None else [fs_tier], kv_events_enabled=kv_events_enabled(vllm_config)
    )
    network = None
    if network_tier is not None:
        network = dataclasses.replace(
            parse_network_tier(network_tier), kv_events=kv_events_enabled(vllm_config)
        )
    spec_name = TIERED_SPEC if disk or network else POOL_SPEC
    connector_extra = _point_at_our_connector(vllm_config, spec_name)
    lower = "disk" if disk else ("network" if network else None)
    pool = _planned_pool(vllm_config, connector_extra, total_ram, lower)
    inputs = None
    if disk is not None or network is not None:
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
        network=network,
    )


def _point_at_our_connector(vllm_config, spec_name: str) -> dict:
    """Name our connector's module and our spec in vLLM's transfer config;
    returns its ``kv_connector_extra_config``."""
    ktc = vllm_config.kv_transfer_config
    if ktc is None:
        # Imported here: vllm.config is still initialising when the platform
        # module is imported.
        from vllm.config import KVTransferConfig

        ktc = vllm_config.kv_transfer_config = KVTransferConfig()
    ktc.kv_connector_extra_config.update(spec_name=spec_name, spec_module_path=SPEC_MODULE)
    ktc.kv_connector_module_path = CONNECTOR_MODULE
    return ktc.kv_connector_extra_config


def _planned_pool(vllm_config, extra: dict, total_ram: int, lower_tier: str | None) -> PoolSize:
    """The size the user gave, else a provisional one (the worker makes it final)."""
    cache = vllm_config.cache_config
    if cache.kv_offloading_size is not None:
        return PoolSize(int(cache.kv_offloading_size * GiB), "--kv-offloading-size")
    explicit = extra.get("cpu_bytes_to_use")
    if explicit:
        return PoolSize(int(explicit), "cpu_bytes_to_use in --kv-transfer-config")
    model = vllm_config.model_config
    per_token = kv_bytes_per_token(model, vllm_config.parallel_config, cache.cache_dtype)
    kv_budget = int(total_ram * cache.gpu_memory_utilization)
    # Provisional: a quarter of the whole budget at most; the worker sizes it
    # again from what is left after weights and activations.
    size = auto_pool_size(
        per_token,
        model.max_model_len,
        kv_budget,
        lower_tier=lower_tier,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
    )
    # vLLM's spec refuses to start without a size; the connector gives it
    # the worker's final one (pool_size.py).
    extra["cpu_bytes_to_use"] = size.bytes
    return PoolSize(size.bytes, f"{size.reason}; at most, final once the weights load", True)


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
    if plan.lower_tier is None or vllm_config.shutdown_timeout > 0:
        return None
    vllm_config.shutdown_timeout = DISK_FLUSH_TIMEOUT_S
    return (
        f"KV offloading: --shutdown-timeout set to {DISK_FLUSH_TIMEOUT_S} s so that a "
        f"stopping server finishes its requests and writes their KV blocks to its disk or "
        f"network tier (pass --shutdown-timeout N to choose another limit)."
    )
