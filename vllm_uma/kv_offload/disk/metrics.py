"""L3 metrics: names, Prometheus definitions, and the per-interval counts.

The disk tier counts on the scheduler thread of the engine-core process;
vLLM's TieringOffloadingManager collects ``DiskTier.get_stats()`` with its
own stats and ships them to the API server, where OffloadPromMetrics
registers every name returned by ``definitions()`` (through the spec's
``build_metric_definitions``). prometheus_client adds ``_total`` to a
counter's name on /metrics: ``vllm:kv_offload_disk_written_blocks_total``.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

PREFIX = "vllm:kv_offload_disk_"
WRITTEN_BLOCKS = PREFIX + "written_blocks"
WRITTEN_BYTES = PREFIX + "written_bytes"
READ_BLOCKS = PREFIX + "read_blocks"
READ_BYTES = PREFIX + "read_bytes"
LOOKUP_HITS = PREFIX + "lookup_hits"
EVICTED_BLOCKS = PREFIX + "evicted_blocks"
BAD_BLOCKS = PREFIX + "bad_blocks"
STORE_SKIPPED = PREFIX + "store_skipped_blocks"
STORE_FAILED = PREFIX + "store_failed_blocks"
PEER_CHANGES = PREFIX + "peer_changes"
LOADS_GIVEN_UP = PREFIX + "loads_given_up"
USED_BYTES = PREFIX + "used_bytes"
CAP_BYTES = PREFIX + "cap_bytes"


def definitions() -> dict[str, OffloadingMetricMetadata]:
    counter, gauge = OffloadingCounterMetadata, OffloadingGaugeMetadata
    return {
        WRITTEN_BLOCKS: counter("KV blocks written to the disk tier."),
        WRITTEN_BYTES: counter("Payload bytes written to the disk tier."),
        READ_BLOCKS: counter("KV blocks restored from the disk tier."),
        READ_BYTES: counter("Payload bytes restored from the disk tier."),
        LOOKUP_HITS: counter("Lookups the disk tier answered with a hit."),
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


class DiskStats:
    """Observations since the last ``take``."""

    def __init__(self) -> None:
        self._stats = OffloadingConnectorStats()
        self._gauges: dict[str, int] = {}
        self._sent_gauges: dict[str, int] = {}

    def count(self, name: str, value: int = 1, reason: str | None = None) -> None:
        if value:
            labels = () if reason is None else (reason,)
            self._stats.increase_counter(name, value, labels)

    def gauge(self, name: str, value: int) -> None:
        self._gauges[name] = value

    def take(self) -> OffloadingConnectorStats | None:
        # A gauge goes out only when it changed: an idle tier reports None.
        for name, value in self._gauges.items():
            if self._sent_gauges.get(name) != value:
                self._stats.set_gauge(name, value)
                self._sent_gauges[name] = value
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, OffloadingConnectorStats()
        return stats
