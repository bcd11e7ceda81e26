"""What the releaser asks of a tier below L1: does it keep this block?

Runs in the engine-core process, under the scheduler's lock (scheduler.py).
An L1 block or pool row is worth less than its RAM when a tier below keeps
the same block readable: a later hit is then a restore, not a recompute.
The host pool's rows (pool_rows.py) and the disk tier
(kv_offload/disk/tier.py) answer that one question the same way, so the
releaser, the scheduler and the tests treat them alike. What each tier can
give back, and how, stays its own (l1_blocks.py, pool_rows.py): the disk
tier gives back no RAM.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vllm.v1.kv_offload.base import OffloadKey


@runtime_checkable
class BlockHolder(Protocol):
    def holds(self, key: OffloadKey) -> bool:
        """This tier has the block, written and readable; no side effect
        (unlike a lookup, which a tier may count or act on)."""
        ...
