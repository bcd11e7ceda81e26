"""The disk tier's metrics (L3): its names and their Prometheus definitions.

Counted on the scheduler thread of the engine-core process, in the lower
tier's counts (../lower_tier/metrics.py, which also names and defines the
counters every tier has); vLLM ships them to the API server's /metrics,
where a counter gets ``_total``: ``vllm:kv_offload_disk_written_blocks_total``.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

from vllm_uma.kv_offload.lower_tier.metrics import TierMetrics

NAMES = TierMetrics("disk", "the disk tier", bad="bad_blocks")
PREFIX = NAMES.prefix
WRITTEN_BLOCKS = NAMES.written_blocks
WRITTEN_BYTES = NAMES.written_bytes
READ_BLOCKS = NAMES.read_blocks
READ_BYTES = NAMES.read_bytes
LOOKUP_HITS = NAMES.lookup_hits
BAD_BLOCKS = NAMES.bad_values
STORE_SKIPPED = NAMES.store_skipped
STORE_FAILED = NAMES.store_failed
EVICTED_BLOCKS = PREFIX + "evicted_blocks"
PEER_CHANGES = PREFIX + "peer_changes"
LOADS_GIVEN_UP = PREFIX + "loads_given_up"
USED_BYTES = PREFIX + "used_bytes"
CAP_BYTES = PREFIX + "cap_bytes"


def definitions() -> dict[str, OffloadingMetricMetadata]:
    counter, gauge = OffloadingCounterMetadata, OffloadingGaugeMetadata
    return {
        **NAMES.moved_definitions(),
        EVICTED_BLOCKS: counter("Block files deleted to stay within the disk cap."),
        BAD_BLOCKS: counter(
            "Block files found unusable on restore (then deleted and recomputed), "
            "by reason: missing, truncated, corrupted, foreign, unreadable, not_a_file, and "
            "with signed block files unsigned, unknown_key, forged (block_mac.py).",
            labelnames=("reason",),
        ),
        STORE_SKIPPED: counter(
            "Blocks not written because the store already holds them or is "
            "writing or deleting them (this server or another), by reason.",
            labelnames=("reason",),
        ),
        STORE_FAILED: counter(
            "Blocks the disk tier could not write, by reason: too_big, no_room "
            "(everything else pinned), disk_full, io_error, ledger (the shared "
            "ledger was busy or unwritable).",
            labelnames=("reason",),
        ),
        LOADS_GIVEN_UP: counter(
            "Block restores still queued past their deadline, given up and "
            "recomputed (I/O threads stuck on a hung file system?)."
        ),
        PEER_CHANGES: counter(
            "Blocks of this server's namespace that other servers on the same "
            "store added or removed, seen through the shared ledger, by change.",
            labelnames=("change",),
        ),
        USED_BYTES: gauge(
            "Bytes of block files under root_dir, all namespaces and servers (the ledger's count)."
        ),
        CAP_BYTES: gauge("The disk tier's cap in bytes (0: no cap)."),
    }
