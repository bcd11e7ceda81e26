"""L3: what the disk tier reports to vLLM: KV events and metric counts.

Scheduler thread of the engine-core process. KV events say which blocks
this server can restore from disk (a KV-aware router learns them); vLLM
takes them with ``take_events``, and the counts with ``get_stats``. What
the tier logs is messages.py's.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent, OffloadKey

from vllm_uma.kv_offload.disk import metrics as m
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class TierReports:
    def __init__(self, medium: Medium, locality: Locality, kv_events: bool, cap_bytes: int | None):
        self._medium = medium
        self._locality = locality
        self._events: list[OffloadingEvent] | None = [] if kv_events else None
        self.stats = m.DiskStats()
        self.stats.gauge(m.CAP_BYTES, cap_bytes or 0)

    def event(self, keys: list[OffloadKey], *, removed: bool) -> None:
        if self._events is not None and keys:
            self._events.append(
                OffloadingEvent(
                    keys=keys,
                    medium=self._medium,
                    removed=removed,
                    locality=self._locality,
                    # None, as vLLM's own fs tier: "ownership" marks a pool
                    # shared by many engines (kvcr), which a router credits
                    # as remote and refuses with LOCAL locality.
                    ownership=None,
                )
            )

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return events
