"""A lower tier's metrics: the names every tier has, and the counts per interval.

Counted on the scheduler thread of the engine-core process (reports.py);
vLLM's TieringOffloadingManager collects a tier's ``get_stats()`` with its
own stats and ships them to the API server, where OffloadPromMetrics
registers every name the tier's ``build_metric_definitions`` returns. A
counter gets ``_total`` on /metrics: ``vllm:kv_offload_disk_read_blocks_total``.

Every tier's names are ``vllm:kv_offload_{tier}_...``. The ones every tier
has (``TierMetrics``): blocks and bytes written and read, lookup hits,
stores failed and skipped, and bad values (named by the tier: a disk tier's
are block files). The help of the first five differs only in where the
blocks are; the rest, and whatever else a tier counts, its own metrics
module defines.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import OffloadingCounterMetadata, OffloadingMetricMetadata


@dataclass(frozen=True)
class TierMetrics:
    """The names every lower tier counts under: ``tier`` ("disk",
    "network") in the prefix, ``where`` in the help ("the disk tier"),
    ``bad`` the name of its unusable values ("bad_blocks")."""

    tier: str
    where: str
    bad: str

    @property
    def prefix(self) -> str:
        return f"vllm:kv_offload_{self.tier}_"

    @property
    def written_blocks(self) -> str:
        return self.prefix + "written_blocks"

    @property
    def written_bytes(self) -> str:
        return self.prefix + "written_bytes"

    @property
    def read_blocks(self) -> str:
        return self.prefix + "read_blocks"

    @property
    def read_bytes(self) -> str:
        return self.prefix + "read_bytes"

    @property
    def lookup_hits(self) -> str:
        return self.prefix + "lookup_hits"

    @property
    def bad_values(self) -> str:
        return self.prefix + self.bad

    @property
    def store_failed(self) -> str:
        return self.prefix + "store_failed_blocks"

    @property
    def store_skipped(self) -> str:
        return self.prefix + "store_skipped_blocks"

    def moved_definitions(self) -> dict[str, OffloadingMetricMetadata]:
        """The counters of blocks and bytes moved, and of lookup hits."""
        counter, where = OffloadingCounterMetadata, self.where
        return {
            self.written_blocks: counter(f"KV blocks written to {where}."),
            self.written_bytes: counter(f"Payload bytes written to {where}."),
            self.read_blocks: counter(f"KV blocks restored from {where}."),
            self.read_bytes: counter(f"Payload bytes restored from {where}."),
            self.lookup_hits: counter(f"Lookups the {self.tier} tier answered with a hit."),
        }


class TierStats:
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
