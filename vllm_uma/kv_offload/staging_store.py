"""A staging pool stores only what its lower tiers lack.

vLLM's tiering manager (``TieringOffloadingManager.prepare_store``) asks the
primary tier, the host pool, which of a request's blocks to store, and the
pool answers "every block I do not hold". With the pool as a staging area
(kv_offload/pool_size.py: a few restores' worth of rows in front of the
disk tier), most blocks a server has ever stored have left the pool but
not the disk. Every time such a block is an L1 hit again, vLLM copies it
from L1 into a pool row once more, and cascades it to the disk tier, which
already holds it. Measured at equal memory (docs/benchmark.md), 4 requests
of L1 hits in flight: the store mover's copies were the engine core's
busiest background thread (1.9 s of 25 s under py-spy), for bytes the
disk already had.

So with a lower tier that can say, without I/O, that it holds a block
(the disk tier's in-memory index: ``DiskTier.holds``), the manager drops
those blocks from a store before the pool sees them, and touches them in
the tier instead (a store would have made them recent there too). To
vLLM's connector a dropped block is one the offloading side already has,
as a block the pool holds is.

Only blocks the pool lacks are dropped: a block still in a pool row goes
through vLLM's own path, which records its use in the pool's LRU.

Where it applies: every secondary tier answers ``holds`` (today: the disk
tier alone). The network tier cannot answer without a round trip, and a
block the disk holds may still be missing from the KV server, so with a
network tier every block is stored as before.

The window it leaves: ``holds`` reads this server's copy of the disk's
index. On a store shared by several servers, a peer's eviction reaches it
through the ledger's feed, a moment later; a block dropped in that moment
is on no tier, and the connector does not offer it again. It is then
recomputed when next needed: a cache miss, never a wrong token.

Process: the engine core's scheduler thread, as vLLM's manager.
"""

from __future__ import annotations

from collections.abc import Collection

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, PrepareStoreOutput, ReqContext
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from vllm_uma.plugin import vllm_contract

# The vLLM internals this module relies on are checked as it is imported, in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class StagingTieringManager(TieringOffloadingManager):
    """vLLM's tiering manager, storing only blocks its lower tiers lack."""

    @classmethod
    def applies(cls, secondary_tiers) -> bool:
        return bool(secondary_tiers) and all(hasattr(t, "holds") for t in secondary_tiers)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        kept, held = [], []
        for k in keys:
            below_only = self.primary_tier.lookup(k, req_context) is LookupResult.MISS and all(
                t.holds(k) for t in self.secondary_tiers
            )
            (held if below_only else kept).append(k)
        if held:
            for tier in self.secondary_tiers:
                tier.touch(held, req_context)
        return super().prepare_store(kept, req_context)
