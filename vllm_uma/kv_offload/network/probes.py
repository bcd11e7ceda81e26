"""Whether the KV server holds a block: asked off the scheduler thread.

Engine-core process. vLLM's ``AsyncLookupManager`` (the base of its own fs
tier's lookups) does the bookkeeping: the scheduler thread's lookups of one
step are collected, sent to one lookup thread as one batch at the step's
end, and answered by the next step; until then the tier answers RETRY, and
vLLM's connector keeps scanning a request's keys, so all of a prefix's keys
are asked in the same batch. A verdict lasts as long as a request that
asked for it (``cleanup``); a load that failed turns its keys' verdicts to
misses (``mark_miss``), so vLLM does not try the same doomed load again.

``batch_lookup`` here: one pipeline of EXISTS per batch and node (EXISTS
does not touch the KV server's LRU clock; the load's MGET does). A node that
does not answer makes its keys misses, and is down until it answers again
(server_link.py).

Why not an index of the keys known to exist, as the disk tier keeps: other
servers store into the KV server and the KV server evicts on its own, unseen, so
such an index would miss their blocks and promise evicted ones.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager

from vllm_uma.kv_offload.network import round_trips
from vllm_uma.kv_offload.network.server_link import ServerLink
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class ServerProbes(AsyncLookupManager):
    def __init__(
        self,
        link: ServerLink,
        name_of: Callable[[bytes], bytes],
        tier_type: str,
    ):
        self._link = link
        self._name_of = name_of
        super().__init__(tier_type=tier_type)  # starts the lookup thread

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> list[bool]:
        """The lookup thread: one round trip for ``keys``."""
        if self._link.fail_fast():
            return [False] * len(keys)
        names = [self._name_of(key) for key in keys]
        replies = round_trips.each_key(
            self._link, names, [("EXISTS", name) for name in names], "a lookup"
        )
        return [not isinstance(reply, Exception) and bool(reply) for reply in replies]
