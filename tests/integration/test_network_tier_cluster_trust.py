"""A cluster's map that names a node outside the hosts the tier trusts
(network/node_trust.py): the node never hears the password, its slots'
blocks are counted misses (recomputed), the other nodes serve theirs.

A real three-node Valkey Cluster with a password; its third node announces
127.0.0.2 and a port where a listener of the test sits, so the map the
tier reads names that listener for a third of the slots, as a map changed
by someone on the path would. The listener records every byte a client
sends it. The url names 127.0.0.1: by default only that host is trusted.
The second test allows 127.0.0.0/8 and sees the password arrive: the
listener would catch a leak."""

from __future__ import annotations

import socket
import threading

import pytest
from network_tier_kit import answered_lookup, make_tier, started_cluster, wait_for
from valkey.crc import key_slot
from vllm.v1.kv_offload.base import LookupResult

from tests.unit.disk_tier_kit import NS, Jobs, Primary, WarningLog, counters, key
from vllm_uma.kv_offload.network import cluster_map
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network.value_format import value_name

PASSWORD = "pw-of-the-cluster"
ELSEWHERE = "127.0.0.2"  # another loopback address: "another host" for the rule
TIMEOUT_S = 0.5


class Listener:
    """A TCP listener that answers nothing and keeps what it is sent."""

    def __init__(self, host: str):
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                with self._lock:
                    self.received += data

    def heard(self, secret: str) -> bool:
        with self._lock:
            return secret.encode() in self.received

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def listener():
    listener = Listener(ELSEWHERE)
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, listener):
    # The third node listens on both addresses (its cluster bus too, which
    # the others reach at the address it announces), and announces the
    # listener's port as its own.
    announce = ("--bind", "127.0.0.1", ELSEWHERE, "--cluster-announce-ip", ELSEWHERE,
                "--cluster-announce-port", str(listener.port))  # fmt: skip
    cluster = started_cluster(
        tmp_path_factory.mktemp("cluster"),
        "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru",
        node_args={2: announce},
    )  # fmt: skip
    for i in range(len(cluster.nodes)):
        cluster.client(i).config_set("requirepass", PASSWORD)
    yield cluster
    cluster.stop()


@pytest.fixture
def primary():
    return Primary()


@pytest.fixture
def password(monkeypatch):
    monkeypatch.setenv("TEST_KV_PASSWORD", PASSWORD)
    return "TEST_KV_PASSWORD"


def keys_by_node(cluster, count: int = 2) -> list[list[bytes]]:
    """``count`` keys held by each node."""
    found: list[list[bytes]] = [[] for _ in cluster.nodes]
    for i in range(1000):
        node = cluster.node_of_slot(key_slot(value_name(NS, key(i))))
        if len(found[node]) < count:
            found[node].append(key(i))
    return found


def test_a_node_outside_the_allowed_hosts_never_hears_the_password(
    cluster, listener, primary, password
):
    with WarningLog(cluster_map.logger) as warned:
        tier = make_tier(cluster, primary, NS, cluster=True, password_env=password,
                         timeout_s=TIMEOUT_S)  # fmt: skip
    try:
        refused = f"{ELSEWHERE}:{listener.port}"
        assert any(refused in line and "cluster_allowed_hosts" in line for line in warned.messages)
        by_node = keys_by_node(cluster)
        trusted_keys, elsewhere_keys = by_node[0] + by_node[1], by_node[2]
        jobs = Jobs(tier)
        data = [primary.fill(row, seed=row + 11) for row in range(6)]
        stored = jobs.stored(trusted_keys + elsewhere_keys, list(range(6)))
        assert not stored.success  # the refused node's two blocks
        primary.clear()
        for k in trusted_keys:
            assert answered_lookup(tier, k) is LookupResult.HIT
        for k in elsewhere_keys:
            assert answered_lookup(tier, k) is LookupResult.MISS
        loaded = jobs.loaded(trusted_keys + elsewhere_keys, list(range(6)))
        # The trusted nodes' blocks come back; the others are left to recompute.
        assert set(loaded.successful_keys) == set(trusted_keys)
        assert [primary.row(r) for r in range(4)] == data[:4]
        assert listener.connections == 0 and not listener.heard(PASSWORD)
        stats = counters(tier.get_stats())
        assert stats[(m.NAMES.store_failed, ("node_refused",))] == 2
        assert stats[(m.LOAD_MISSES, ("node_refused",))] == 2
        assert stats[(m.REFUSED_NODES, ())] == 1
    finally:
        tier.shutdown()
    assert listener.connections == 0 and not listener.heard(PASSWORD)


def test_a_node_the_settings_allow_is_connected_to_with_the_password(
    cluster, listener, primary, password
):
    """The control: allowed, the listener gets the password. Without it,
    the test above could pass on a listener that hears nothing at all."""
    tier = make_tier(cluster, primary, NS, cluster=True, password_env=password,
                     timeout_s=TIMEOUT_S, cluster_allowed_hosts=["127.0.0.0/8"])  # fmt: skip
    try:
        wait_for(lambda: listener.heard(PASSWORD), timeout=5.0, what="the password at the node")
        assert counters(tier.get_stats())[(m.REFUSED_NODES, ())] == 0
    finally:
        tier.shutdown()
