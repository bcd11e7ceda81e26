"""What a lower tier reports: counts, KV events, bad values, warnings, its start-up line.

Scheduler thread of the engine-core process (the disk tier's start-up
too, before serving). vLLM takes the counts with a tier's ``get_stats``
(metrics.py) and its KV events with ``take_events``: which blocks this
server can restore from the tier, so that a KV-aware router learns them.
The operator reads the rest in the log, through the tier's own logger
(tests and operators find a tier's lines by it): one start-up line, and
warnings that would otherwise repeat many times a second, given once per
kind for the process's life (the disk tier's choice: a failing disk
fails the same way until someone acts) or once per kind an interval (the
network tier's: a KV server's episodes come and go). A value found
unusable (a bad block file, a bad network value) is deleted by the tier,
counted here under its reason and warned of the same way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from logging import Logger

from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent, OffloadKey

from vllm_uma.kv_offload.lower_tier.metrics import TierMetrics, TierStats
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class Warnings:
    """Warnings of each kind at most once per ``every_s`` (inf: once)."""

    def __init__(
        self,
        logger: Logger,
        every_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger = logger
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}

    def warn(self, kind: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``kind`` was warned of too lately;
        True if it was logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._every_s:
            return False
        self._last[kind] = now
        self.logger.warning(msg, *args)
        return True


class TierReports:
    """One tier's counts, KV events and warnings. ``ownership`` goes with
    each KV event (None: this server's own blocks; a cache id: a cache
    every host reads, which a router files under it)."""

    def __init__(
        self,
        metrics: TierMetrics,
        medium: Medium,
        locality: Locality,
        kv_events: bool,
        warnings: Warnings,
        ownership: str | None = None,
    ):
        self.metrics = metrics
        self.stats = TierStats()
        self.warnings = warnings
        self._medium = medium
        self._locality = locality
        self._ownership = ownership
        self._events: list[OffloadingEvent] | None = [] if kv_events else None

    # -- counts ------------------------------------------------------------

    def hit(self) -> None:
        self.stats.count(self.metrics.lookup_hits)

    def moved(self, is_load: bool, blocks: int, nbytes: int) -> None:
        """Blocks read (a load) or written (a store), and their payload bytes."""
        names = self.metrics
        self.stats.count(names.read_blocks if is_load else names.written_blocks, blocks)
        self.stats.count(names.read_bytes if is_load else names.written_bytes, nbytes)

    def store_failed(self, reason: str, blocks: int = 1) -> None:
        self.stats.count(self.metrics.store_failed, blocks, reason=reason)

    def store_skipped(self, blocks: int = 1, reason: str | None = None) -> None:
        self.stats.count(self.metrics.store_skipped, blocks, reason=reason)

    def bad(self, reason: str, count: int, msg: str, *args: object) -> None:
        """``count`` values found unusable for ``reason`` (deleted by the
        tier, recomputed by vLLM): counted by reason, and warned of."""
        self.stats.count(self.metrics.bad_values, count, reason=reason)
        self.warnings.warn("bad " + reason, msg, *args)

    # -- KV events ---------------------------------------------------------

    def event(self, keys: list[OffloadKey], *, removed: bool) -> None:
        if self._events is not None and keys:
            self._events.append(
                OffloadingEvent(
                    keys=keys,
                    medium=self._medium,
                    removed=removed,
                    locality=self._locality,
                    ownership=self._ownership,
                )
            )

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events

    # -- the start-up line ---------------------------------------------------

    def started(self, tier: str, at: str, facts: Sequence[str]) -> None:
        """The one line a tier logs when it is ready: ``{tier} at {at}:
        {facts, joined by "; "}.``"""
        self.warnings.logger.info("%s at %s: %s.", tier, at, "; ".join(facts))
