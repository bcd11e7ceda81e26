"""The network tier's count of its blocks (vllm_uma/kv_offload/network/server_usage.py)
on a stand-in client whose SCAN pages repeat a name. On a real valkey-server:
tests/integration/test_network_tier_usage.py."""

from __future__ import annotations

from disk_tier_kit import NS, key

from vllm_uma.kv_offload.network import server_usage
from vllm_uma.kv_offload.network.value_format import value_name


class PagedScan:
    """A client whose SCAN returns these pages (a name twice, as SCAN may
    while the KV server resizes its table), each name 100 bytes."""

    def __init__(self, pages: list[list[bytes]]):
        self._pages = pages

    def scan(self, cursor: int, match: bytes, count: int):
        following = cursor + 1 if cursor + 1 < len(self._pages) else 0
        return following, list(self._pages[cursor])

    def pipeline(self, transaction: bool):
        return self

    def memory_usage(self, name: bytes) -> None:
        self._asked = getattr(self, "_asked", 0) + 1

    def execute(self) -> list[int]:
        asked, self._asked = self._asked, 0
        return [100] * asked


def test_a_name_scan_returns_twice_is_counted_once():
    names = [value_name(NS, key(i)) for i in range(3)]
    usage = server_usage.namespace_usage(PagedScan([names[:2], names[1:], [names[0]]]), NS)
    assert (usage.blocks, usage.bytes, usage.complete) == (3, 300, True)
