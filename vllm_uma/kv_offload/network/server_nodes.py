"""The KV server's nodes and which one holds a key: one node for a standalone
KV server, the primaries of a Valkey/Redis Cluster.

Engine-core process, on the tier's threads; nothing here keeps state of
its own beyond a node's connection pool (the episodes are the link's,
server_link.py).

In a cluster a key lives on the primary that holds its slot: the CRC16 of
the key's hash tag (value_format.py tags the block's hash), modulo 16384.
The map from slots to primaries is read with ``CLUSTER SLOTS`` (Redis 3.0
on, every Valkey), from any node that answers.

A map of our own, not valkey-py's ``ValkeyCluster``: its pipeline fails as
a whole when one node is gone, after retrying it three times and reading
the map again from the seed nodes each time (seconds), so every block of a
prefix would be a miss for one dead node. Ours gives misses for that node's
slots only, at once while it is down, and takes the command packer the
standalone client uses (server_link.py's measurements). A primary the map
names outside the hosts the tier trusts (node_trust.py) is a ``RefusedNode``:
no connection, so no password, ever goes to it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import valkey
from valkey.connection import Encoder, PythonRespSerializer
from valkey.crc import VALKEY_CLUSTER_HASH_SLOTS, key_slot

from vllm_uma.kv_offload.network.bounded_replies import BoundedConnection
from vllm_uma.kv_offload.network.credentials import password_source
from vllm_uma.kv_offload.network.settings import NetworkTierSettings
from vllm_uma.kv_offload.network.tls import handshake

# Connections per node: one per transfer thread, one for lookups, one for
# the watch thread and the checks.
POOL_CONNECTIONS = 8
# Pieces of a command up to this size are joined before a send; larger ones
# (values) go to the socket as they are, without a copy.
SEND_CUTOFF_BYTES = 6000
SLOTS = VALKEY_CLUSTER_HASH_SLOTS


class TlsConnection(BoundedConnection):
    """valkey's TCP connection, then our TLS handshake (tls.py); replies
    read and commands sent under their bounds, as over plain TCP.

    Not valkey's SSLConnection: that one gives the handshake the command
    timeout and reports every failure as a ConnectionError's text, where a
    handshake that gets no answer (a plain KV server on the port) must be told
    from a host that is gone, within the connect timeout. ``_connect`` is
    the hook valkey's own connection classes implement."""

    def __init__(self, *, tls_config: NetworkTierSettings, **kwargs):
        self._tls_config = tls_config
        super().__init__(**kwargs)

    def _connect(self):
        sock = super()._connect()  # connected; its timeout is the command timeout now
        sock.settimeout(self.socket_connect_timeout)
        try:
            tls_sock = handshake(self._tls_config, sock, self.host)
        except BaseException:
            sock.close()  # a no-op once the TLS socket took it over (and closed it)
            raise
        tls_sock.settimeout(self.socket_timeout)
        return tls_sock


def connection_pool(settings: NetworkTierSettings, host: str, port: int) -> valkey.ConnectionPool:
    kwargs = dict(
        host=host,
        port=port,
        db=settings.db,
        socket_timeout=settings.timeout_s,
        socket_connect_timeout=settings.connect_timeout_s,
        credential_provider=password_source(settings),
        max_connections=POOL_CONNECTIONS,
        client_name="vllm-uma",
        # Replies are read under their round trip's deadline and sizes
        # (bounded_replies.py). libvalkey's command packer copies every
        # value into one buffer, 3x slower than the Python one, which sends
        # memoryviews as they are (measured: network/__init__.py).
        connection_class=BoundedConnection,
        command_packer=PythonRespSerializer(
            SEND_CUTOFF_BYTES, Encoder("utf-8", "strict", False).encode
        ),
    )
    if settings.tls:
        kwargs.update(connection_class=TlsConnection, tls_config=settings)
    return valkey.ConnectionPool(**kwargs)


def address_of(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Node:
    """One KV server process and its connections. ``up``, ``full`` and the
    episode's counts are the link's, changed under its lock."""

    def __init__(self, settings: NetworkTierSettings, host: str, port: int):
        self.host = host
        self.port = port
        self.address = address_of(host, port)
        self.url = f"{settings.scheme}://{self.address}/{settings.db}"  # never a secret
        self.pool = connection_pool(settings, host, port)
        self.client = valkey.Valkey(connection_pool=self.pool)
        self.up = True
        self.full = False  # the node refuses writes (OOM)
        self.down_since = 0.0
        self.failed_meanwhile = 0
        # The watch's last check failure other than no answer, said once.
        self.check_failure: str | None = None

    def __repr__(self) -> str:
        return f"Node({self.address})"


@dataclass(frozen=True)
class RefusedNode:
    """A primary the map names at an address the tier does not trust
    (node_trust.py): its slots' keys fail at once, never connected to."""

    address: str


# Where a batch's keys go: per node, the indices of the keys, grouped by
# slot (a multi-key command must stay within one slot). ``None``: no node
# holds the slot (the map is not read yet, or the cluster lost it).
Route = dict[Node | RefusedNode | None, list[list[int]]]


def route(
    names: Sequence[bytes], slots: Sequence[Node | RefusedNode | None] | None, single: Node
) -> Route:
    """Group ``names`` by node and slot; ``slots`` None: a standalone KV server
    (``single``), every key in one group."""
    if not names:
        return {}
    if slots is None:
        return {single: [list(range(len(names)))]}
    by_node: dict[Node | RefusedNode | None, dict[int, list[int]]] = defaultdict(dict)
    for i, name in enumerate(names):
        slot = key_slot(name)
        by_node[slots[slot]].setdefault(slot, []).append(i)
    return {node: list(groups.values()) for node, groups in by_node.items()}


def read_slot_ranges(node: Node) -> list[tuple[int, int, str, int]]:
    """``CLUSTER SLOTS`` of ``node``: (first, last, host, port) of each
    range's primary. Raises the client's errors (a ResponseError from an
    KV server that is not a cluster)."""
    ranges = []
    for first, last, primary, *_replicas in node.client.execute_command("CLUSTER SLOTS"):
        host, port = primary[0], primary[1]
        host = host.decode() if isinstance(host, bytes) else str(host)
        # An empty or "?" host: the node does not know its own address; it
        # is the one asked.
        ranges.append((int(first), int(last), host if host not in ("", "?") else node.host, port))
    return ranges
