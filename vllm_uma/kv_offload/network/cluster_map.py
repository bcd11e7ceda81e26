"""A cluster's map: which primary holds each of the 16384 slots.

Engine-core process. Read at start-up (node_checks.py, where a KV server that
is not a cluster is refused), then by the link's watch thread whenever it
may have changed: a node went down (a replica may take its slots over), a
node answered MOVED or ASK (slots moved), or it was never read (the seed
node did not answer at start-up). Until then the keys of a slot with no
known primary are misses; a cache may miss, so a redirection is never
followed.

A primary at an address the tier does not trust (node_trust.py) is never
connected to: its slots hold a ``RefusedNode``, their keys are misses
(``reason="node_refused"``), and one warning per map that newly names it
says what to add to ``cluster_allowed_hosts`` if it is ours.

The transfer and lookup threads read ``slots`` and ``primaries`` without a
lock: each is replaced whole, never changed in place.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_uma.kv_offload.network.node_trust import NodeTrust
from vllm_uma.kv_offload.network.server_nodes import (
    SLOTS,
    Node,
    RefusedNode,
    address_of,
    read_slot_ranges,
)
from vllm_uma.kv_offload.network.settings import NetworkTierSettings
from vllm_uma.log import get_logger

logger = get_logger(__name__)


class ClusterMap:
    def __init__(self, settings: NetworkTierSettings, seed: Node):
        self._settings = settings
        self.seed = seed  # the url's node: asked when no primary answers
        self.trust = NodeTrust(settings)
        self.slots: list[Node | RefusedNode | None] = [None] * SLOTS
        self.primaries: tuple[Node, ...] = ()
        self.refused: tuple[RefusedNode, ...] = ()
        self.needs_reading = True

    @property
    def uncovered(self) -> int:
        return sum(node is None for node in self.slots)

    def stale(self) -> None:
        self.needs_reading = True

    def read(self, asked: Node) -> list[Node]:
        """The map as ``asked`` sees it; returns the primaries it did not
        know. Raises the client's errors."""
        known = {node.address: node for node in (self.seed, *self.primaries)}
        slots: list[Node | RefusedNode | None] = [None] * SLOTS
        primaries: dict[str, Node] = {}
        refused: dict[str, RefusedNode] = {}
        allowed = self.trust.checker()
        for first, last, host, port in read_slot_ranges(asked):
            address = address_of(host, port)
            node = primaries.get(address) or known.get(address) or refused.get(address)
            if node is None and not allowed(host):
                node = refused[address] = RefusedNode(address)
            elif node is None:
                node = Node(self._settings, host, port)
            if isinstance(node, Node):
                primaries[address] = node
            slots[first : last + 1] = [node] * (last - first + 1)
        gone = [node for node in self.primaries if node.address not in primaries]
        newly_refused = [node for node in refused.values() if node not in self.refused]
        self.slots, self.primaries = slots, tuple(primaries.values())
        self.refused = tuple(refused.values())
        self.needs_reading = False
        for node in newly_refused:
            self._refuse(node)
        for node in gone:
            self._forget(node)
        return [node for address, node in primaries.items() if address not in known]

    def read_again(self, try_node: Callable[[Node, Callable], bool]) -> list[Node]:
        """The map from the first node that answers (primaries up first);
        the primaries it did not know. Nothing changes if none answers."""
        if not self.needs_reading:
            return []
        new: list[Node] = []
        candidates = sorted({*self.primaries, self.seed}, key=lambda node: not node.up)
        for node in candidates:
            if try_node(node, lambda asked: new.extend(self.read(asked))):
                return new
        return []

    def _refuse(self, node: RefusedNode) -> None:
        logger.warning(
            "network KV tier: the cluster's map names a primary at %s, outside %s: the tier "
            "does not connect to it (the password never goes there), and the blocks of its "
            "slots are misses, recomputed. If it is a node of your cluster, add its address "
            "(or its network) to cluster_allowed_hosts, or reach the cluster over TLS "
            "(valkeys://).",
            node.address,
            self.trust.describe(),
        )

    def _forget(self, node: Node) -> None:
        if not node.up:
            logger.info(
                "network KV tier: the cluster node at %s holds no slots any more (the "
                "cluster gave them to another node): its episode ends.",
                node.url,
            )
        if node is not self.seed:
            node.pool.disconnect(inuse_connections=False)
