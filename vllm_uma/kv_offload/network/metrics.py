"""The network tier's metrics: its names and their Prometheus definitions.

Counted on the scheduler thread of the engine-core process (tier.py), in
the lower tier's counts (../lower_tier/metrics.py, which also names and
defines the counters every tier has); vLLM ships them to the API server's
/metrics, where a counter gets ``_total``:
``vllm:kv_offload_network_read_blocks_total``. vLLM's own per-tier metrics
(``vllm:kv_offload_tiering_*{tier="valkey"}``: bytes and time read and
written, lookups, hits, failed jobs) come on top.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

from vllm_uma.kv_offload.lower_tier.metrics import TierMetrics

NAMES = TierMetrics("network", "the network tier's KV server", bad="bad_values")
LOAD_MISSES = NAMES.prefix + "load_missed_blocks"
# Its name keeps "engine", the word this project used for the KV server
# before: dashboards and alerts scrape it by that name.
SERVER_UP = NAMES.prefix + "engine_up"
REFUSED_NODES = NAMES.prefix + "refused_nodes"
# Pinned blocks kept alive in the KV server (pin_refresh.py).
PINNED_BLOCKS = NAMES.prefix + "pinned_blocks"
PINNED_BYTES = NAMES.prefix + "pinned_bytes"
PINNED_MISSING = NAMES.prefix + "pinned_missing_blocks"
PIN_REFRESHES = NAMES.prefix + "pin_refreshes"


def definitions() -> dict[str, OffloadingMetricMetadata]:
    counter, gauge = OffloadingCounterMetadata, OffloadingGaugeMetadata
    return {
        **NAMES.moved_definitions(),
        LOAD_MISSES: counter(
            "Blocks a restore from the network tier did not bring back (recomputed), by "
            "reason: absent (evicted since the lookup), engine_down, engine_slow (not all "
            "back by the restore's deadline), moved (a cluster's slot moved), node_refused "
            "(its node is not trusted), refused, unread (after an oversized value on the same "
            "connection), error, or a bad value's reason (truncated, corrupted, foreign, "
            "oversized, unsigned, unknown_key, forged).",
            labelnames=("reason",),
        ),
        NAMES.bad_values: counter(
            "Values found unusable on restore (then deleted and recomputed), by reason: "
            "truncated, corrupted, foreign (another namespace, key or format), oversized "
            "(longer than one block: refused unread), unsigned (no MAC tag), unknown_key (a "
            "tag by a key this server lacks), forged (a tag that does not match).",
            labelnames=("reason",),
        ),
        NAMES.store_failed: counter(
            "Blocks the network tier could not store, by reason: engine_down, engine_full "
            "(OOM: the KV server refuses writes), moved, node_refused, refused, error.",
            labelnames=("reason",),
        ),
        NAMES.store_skipped: counter(
            "Blocks not sent because this server saw them in the KV server moments ago."
        ),
        SERVER_UP: gauge(
            "1 while the network tier's KV server answers (a cluster: any of its nodes), else 0."
        ),
        REFUSED_NODES: gauge(
            "Primaries the cluster's map names at addresses the tier does not trust "
            "(cluster_allowed_hosts): never connected to, their slots' blocks are misses."
        ),
        PINNED_BLOCKS: gauge(
            "Blocks of live pins of this server's namespace that the KV server held at the "
            "last pin refresh (TOUCH found them, and renewed their place in its LRU)."
        ),
        PINNED_BYTES: gauge("Payload bytes of those blocks."),
        PINNED_MISSING: gauge(
            "Blocks of live pins that the last pin refresh did not find in the KV server: "
            "evicted, not stored there yet, or their node did not answer (restored from "
            "disk, or recomputed, when asked)."
        ),
        PIN_REFRESHES: counter(
            "Pin refreshes sent: a TOUCH of every pinned block of this server's namespace "
            "in the KV server, every 2 s (PIN_REFRESH_S) while pins live (with a disk tier, "
            "which holds them)."
        ),
    }
