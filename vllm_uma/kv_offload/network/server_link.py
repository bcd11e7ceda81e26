"""The network tier's link to its KV server: its nodes' health, episodes, reconnects.

Engine-core process. The link serves the tier's transfer threads and its
lookup thread (transfers.py, probes.py); the scheduler thread only
reads ``up`` (bools, atomic under the GIL) and never waits on a socket.

The KV server is one node (standalone) or the primaries of a cluster
(``"cluster": true``; server_nodes.py, cluster_map.py). Every operation is
one round trip per node (round_trips.py), all nodes at once.

A node that is gone or slow (a connection refused or reset, a timeout) is
down: one warning for its episode, its sockets dropped, and every key it
holds a miss at once, with no round trip, until it is back; the other
nodes serve theirs. A watch thread pings the nodes that are down every
``retry_interval_s`` (and, for a cluster, reads the map again: a replica
may have taken the slots over); when one answers, it is checked again (it
may be a new KV server), it is up and one line says so. A full node (OOM
errors on writes) is its own episode: stores to it fail and are counted,
loads go on.

A round trip, its sends and every socket read of its replies, ends by one
deadline: the settings' timeout (``timeout_s``) from its start, or its
load's deadline if that comes first (round_trips.py, bounded_replies.py);
whichever nodes froze, it costs one timeout. The client retries nothing
(``Retry(NoBackoff(), 0)``, its default when no retry is asked for); the
link, not the client, decides when to try a node again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import valkey

from vllm_uma.kv_offload.network.cluster_map import ClusterMap
from vllm_uma.kv_offload.network.server_nodes import Node, Route, route
from vllm_uma.kv_offload.network.settings import NetworkTierSettings
from vllm_uma.kv_offload.network.tls import explain
from vllm_uma.log import get_logger

logger = get_logger(__name__)

RETRY_INTERVAL_S = 2.0
# Error replies of a cluster whose slot moved (or is moving) to another node.
REDIRECTIONS = ("MOVED", "ASK", "TRYAGAIN")
# Errors that mean "the node did not answer": it goes down.
LINK_ERRORS = (valkey.exceptions.ConnectionError, valkey.exceptions.TimeoutError, OSError)


class NoAnswer(valkey.exceptions.ConnectionError):
    """The reply of a key whose node did not answer, is down, or is not known."""


class NodeRefused(valkey.exceptions.ValkeyError):
    """The reply of a key whose primary is at an address the tier does not
    trust (node_trust.py): never asked."""


class ServerLink:
    def __init__(
        self,
        settings: NetworkTierSettings,
        check_node: Callable[[Node], None],
        retry_interval_s: float = RETRY_INTERVAL_S,
    ):
        self.url = settings.url
        self._settings = settings
        self.timeout_s = settings.timeout_s
        self.db = settings.db
        self.seed = Node(settings, settings.host, settings.port)
        self.cluster = ClusterMap(settings, self.seed) if settings.cluster else None
        self._check_node = check_node  # before a node is up again (warns)
        self._retry_interval_s = retry_interval_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._watch = threading.Thread(
            target=self._watch_loop, name="uma-kv-net-watch", daemon=True
        )
        self._watch.start()

    @property
    def primaries(self) -> tuple[Node, ...]:
        return (self.seed,) if self.cluster is None else self.cluster.primaries

    @property
    def up(self) -> bool:
        """Some node answers: the tier may serve some blocks."""
        return any(node.up for node in self.primaries)

    @property
    def refused_nodes(self) -> int:
        """Primaries of the map the tier does not connect to (cluster_map.py)."""
        return 0 if self.cluster is None else len(self.cluster.refused)

    # -- for round_trips.py, on the tier's threads -----------------------------

    def route(self, names: Sequence[bytes]) -> Route:
        slots = None if self.cluster is None else self.cluster.slots
        return route(names, slots, self.seed)

    def skipped(self, node: Node) -> bool:
        """True while ``node`` is down: its keys fail without a round trip."""
        if node.up:
            return False
        with self._lock:
            node.failed_meanwhile += 1
        return True

    def node_of(self, name: bytes) -> Node | None:
        """The node that holds ``name``; None if none is known or trusted."""
        node = next(iter(self.route([name])))
        return node if isinstance(node, Node) else None

    def why(self, exc: BaseException, node: Node) -> str:
        """A failure as a log line says it: a TLS failure with its fix (tls.py)."""
        return explain(exc, self._settings, node.url) or f"{type(exc).__name__}: {exc}"

    # -- episodes, from any thread ---------------------------------------------

    def node_down(self, node: Node, exc: BaseException, what: str) -> None:
        """``what`` failed for want of an answer from ``node``: one warning
        per episode."""
        with self._lock:
            if not node.up:
                node.failed_meanwhile += 1
                return
            node.up = False
            node.down_since = time.monotonic()
            node.failed_meanwhile = 1
        whose = "its blocks are misses"
        if self.cluster is not None and not self.cluster.primaries:
            whose = "the cluster's map is not read yet, so every block is a miss"
        elif self.cluster is not None:
            whose = "the blocks of its slots are misses (the other nodes serve theirs)"
        logger.warning(
            "network KV tier: the %s at %s did not answer (%s, during %s): %s, "
            "recomputed, until it answers again; trying every %.0f s.",
            "KV server" if self.cluster is None else "cluster node",
            node.url,
            self.why(exc, node),
            what,
            whose,
            self._retry_interval_s,
        )
        node.pool.disconnect(inuse_connections=False)  # sockets of a gone node
        self._wake.set()

    def slots_moved(self) -> None:
        """A node answered MOVED or ASK: the watch thread reads the map again."""
        if self.cluster is not None:
            self.cluster.stale()
            self._wake.set()

    def start_down(self, exc: BaseException) -> None:
        """At start-up: the KV server does not answer yet; serve without it."""
        self.node_down(self.seed, exc, "the start-up check")

    def fail_fast(self) -> bool:
        """True while every node is down: the caller fails without a round trip."""
        if self.up:
            return False
        with self._lock:
            for node in self.primaries:
                node.failed_meanwhile += 1
        return True

    def refused_write(self, node: Node | None, exc: BaseException) -> None:
        """A write came back with an OOM error: the node is full."""
        if node is None:
            return
        with self._lock:
            if node.full:
                return
            node.full = True
        logger.warning(
            "network KV tier: the KV server at %s is full and refuses writes (%s): blocks are not "
            "stored there until it takes writes again. Give it maxmemory-policy allkeys-lru "
            "(CONFIG SET maxmemory-policy allkeys-lru).",
            node.url,
            exc,
        )

    def took_write(self, node: Node | None) -> None:
        if node is None or not node.full:
            return
        with self._lock:
            was_full, node.full = node.full, False
        if was_full:
            logger.info("network KV tier: the KV server at %s takes writes again.", node.url)

    # -- the watch thread -------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            while self._needs_watch() and not self._stopping.wait(self._retry_interval_s):
                self._tend()

    def _needs_watch(self) -> bool:
        if self.cluster is not None and self.cluster.needs_reading:
            return True
        return not self.seed.up or not all(node.up for node in self.primaries)

    def _tend(self) -> None:
        if self.cluster is not None:
            if not all(node.up for node in self.primaries):
                self.cluster.stale()  # a replica may have taken a dead node's slots over
            for node in self.cluster.read_again(self._try_node):
                self._try_node(node, self._check_node)  # a new primary: checked
        for node in {self.seed, *self.primaries}:
            if not node.up and self._answers(node):
                self._back(node)

    def _try_node(self, node: Node, action: Callable[[Node], object]) -> bool:
        """``action(node)``; False if the node did not answer."""
        try:
            action(node)
        except LINK_ERRORS:
            node.pool.disconnect(inuse_connections=False)
            return False
        except Exception as exc:  # the check itself failed: retried, never the thread's end
            self._check_failed(node, exc)
            return False
        return True

    def _check_failed(self, node: Node, exc: Exception) -> None:
        """One log line, with its traceback, per failure that repeats: the
        watch tries again every retry interval, and a KV server that keeps
        refusing the check (an ACL that forbids a command, say) would
        otherwise print a traceback every time."""
        failure = f"{type(exc).__name__}: {exc}"
        if node.check_failure == failure:
            return
        node.check_failure = failure
        logger.error(
            "network KV tier: checking the KV server at %s failed (%s); its blocks stay misses. "
            "Trying again every %.0f s; this is said again only if the failure changes.",
            node.url,
            failure,
            self._retry_interval_s,
            exc_info=exc,
        )

    def _answers(self, node: Node) -> bool:
        def ping_and_check(node: Node) -> None:
            node.client.ping()
            self._check_node(node)

        if not self._try_node(node, ping_and_check):
            return False
        # Forgotten only when the check itself passes (a cluster's map read
        # from the same node succeeds while its check keeps failing).
        node.check_failure = None
        return True

    def _back(self, node: Node) -> None:
        with self._lock:
            node.up = True
            gone_s = time.monotonic() - node.down_since
            failed = node.failed_meanwhile
        logger.info(
            "network KV tier: the %s at %s answers again after %.1f s (%d operations "
            "failed meanwhile, as misses).",
            "KV server" if self.cluster is None else "cluster node",
            node.url,
            gone_s,
            failed,
        )

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._watch.join(timeout=self._retry_interval_s + 1.0)
        for node in {self.seed, *self.primaries}:
            node.pool.disconnect()
