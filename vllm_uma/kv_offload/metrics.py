"""The vllm:kv_offload_* counters vllm-uma adds to /metrics: names and help.

Counted in the engine-core process by the connector's scheduler side
(connector.py) into vLLM's ``OffloadingConnectorStats``, which travels to
the API server with each step's scheduler stats. There vLLM's
``OffloadPromMetrics`` turns each name into a Prometheus counter (exported
with a ``_total`` suffix): our specs add ``DEFINITIONS`` to the ones they
give it (spec.py, ``build_metric_definitions``), and the subclass below
shows them at 0 from the start. A stats name that is not registered fails
the API server's metrics update, so this dict is the one list of our names.

What vLLM already exports beside these: bytes and seconds moved
(``vllm:kv_offload_total_bytes_total{transfer_type="GPU_to_CPU"|"CPU_to_GPU"}``),
failed store allocations (``vllm:kv_offload_allocation_failure_total``) and
prompt tokens restored (``vllm:prompt_tokens_cached_by_source_total{source="host"}``).
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics
from vllm.v1.kv_offload.base import OffloadingCounterMetadata

from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

BLOCKS_STORED = "vllm:kv_offload_blocks_stored"
BLOCKS_RESTORED = "vllm:kv_offload_blocks_restored"
RESTORE_HITS = "vllm:kv_offload_restore_hits"
STORE_RETRIES = "vllm:kv_offload_store_retries"
BLOCKS_DROPPED = "vllm:kv_offload_blocks_dropped"
# Counted by the release thread (memory_release/scheduler.py).
KV_GIVEN_BACK_IDLE = "vllm:kv_memory_given_back_idle_bytes"
KV_GIVEN_BACK_PRESSURE = "vllm:kv_memory_given_back_pressure_bytes"
KV_WARMED = "vllm:kv_memory_warmed_bytes"

DEFINITIONS = {
    BLOCKS_STORED: OffloadingCounterMetadata(
        documentation="KV blocks copied from the KV cache into the host pool."
    ),
    BLOCKS_RESTORED: OffloadingCounterMetadata(
        documentation="KV blocks copied from the host pool back into the KV cache."
    ),
    RESTORE_HITS: OffloadingCounterMetadata(
        documentation="Requests whose prefix was restored, at least in part, from the host pool."
    ),
    STORE_RETRIES: OffloadingCounterMetadata(
        documentation=(
            "Stores of finished requests tried again on a later step because "
            "the host pool had no free row; their KV blocks are kept meanwhile."
        )
    ),
    BLOCKS_DROPPED: OffloadingCounterMetadata(
        documentation=(
            "KV blocks of finished requests never stored in the host pool: more "
            "blocks than the pool has rows, or no room after the bounded wait."
        )
    ),
    KV_GIVEN_BACK_IDLE: OffloadingCounterMetadata(
        documentation=(
            "Bytes of KV memory (KV cache and host pool pages) given back to the "
            "system after the server was idle (release_free_kv)."
        )
    ),
    KV_GIVEN_BACK_PRESSURE: OffloadingCounterMetadata(
        documentation=(
            "Bytes of KV memory given back to the system under memory pressure (memory_pressure)."
        )
    ),
    KV_WARMED: OffloadingCounterMetadata(
        documentation=(
            "Bytes of KV memory made resident ahead of use by the warm reserve "
            "(warm_kv_tokens): free KV cache blocks and host pool rows the next "
            "request gets."
        )
    ),
}


class UmaOffloadPromMetrics(OffloadPromMetrics):
    """vLLM's offloading metrics, ours among them (API server process)."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        # vLLM registers ours with the spec's (spec.py).
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        for name in DEFINITIONS:
            # Shown at 0 from the start: "no block dropped" is an answer too.
            for engine_idx in per_engine_labelvalues:
                self._get_prometheus_metric(name, (), engine_idx)
