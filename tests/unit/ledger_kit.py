"""The shared ledger's test kit: block names and the callbacks its
eviction calls (each module keeps its own ``ledger`` fixture)."""

from __future__ import annotations

from vllm_uma.kv_offload.disk.layout import BlockRef

NS = b"\x11" * 16


def ref(i: int, ns: bytes = NS) -> BlockRef:
    return BlockRef(ns, i.to_bytes(4, "big"))


def never(_: BlockRef) -> bool:
    return False


class Unlinks(list):
    def __call__(self, r: BlockRef) -> None:
        self.append(r)
