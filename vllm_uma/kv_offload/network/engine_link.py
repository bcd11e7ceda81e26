"""The network tier's link to its engine: connections, health, episodes.

Engine-core process. One connection pool serves the tier's transfer threads
and its lookup thread (transfer_threads.py, probes.py); the scheduler thread
only reads ``up``, a bool (atomic under the GIL), and never waits on a
socket.

An engine that is gone or slow (a connection refused or reset, a timeout)
puts the link down: one warning for the episode, the pool's sockets
dropped, and every operation until it is back answers "miss" at once
instead of waiting out a timeout per request. A watch thread pings the
engine every ``retry_interval_s`` meanwhile; when it answers, the engine's
policy is checked again (it may be a new engine), the link is up and one
line says so. A full engine (OOM errors on writes) is its own episode:
stores fail and are counted, loads go on.

Every command has the settings' timeout (``timeout_s``) and the client
retries nothing (``Retry(NoBackoff(), 0)``, the client's default when no
retry is asked for): an operation fails within one timeout, and the
breaker, not the client, decides when to try again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import valkey
from valkey.connection import Encoder, PythonRespSerializer

from vllm_uma.kv_offload.network.credentials import password_source
from vllm_uma.kv_offload.network.settings import NetworkTierConfig
from vllm_uma.log import get_logger

logger = get_logger(__name__)

RETRY_INTERVAL_S = 2.0
# Connections: one per transfer thread, one for lookups, one for the watch.
POOL_CONNECTIONS = 8
# Pieces of a command up to this size are joined before a send; larger ones
# (values) go to the socket as they are, without a copy.
SEND_CUTOFF_BYTES = 6000

# Errors that mean "the engine did not answer": the link goes down.
LINK_ERRORS = (valkey.exceptions.ConnectionError, valkey.exceptions.TimeoutError, OSError)


def connection_pool(config: NetworkTierConfig) -> valkey.ConnectionPool:
    kwargs = dict(
        host=config.host,
        port=config.port,
        db=config.db,
        socket_timeout=config.timeout_s,
        socket_connect_timeout=config.connect_timeout_s,
        credential_provider=password_source(config),
        max_connections=POOL_CONNECTIONS,
        client_name="vllm-uma",
        # libvalkey (C) parses replies, 2-3x faster than Python on large
        # values; but its command packer copies every value into one
        # buffer, 3x slower than the Python one, which sends memoryviews
        # as they are (measured: valkey/__init__.py).
        command_packer=PythonRespSerializer(
            SEND_CUTOFF_BYTES, Encoder("utf-8", "strict", False).encode
        ),
    )
    if config.tls:
        kwargs.update(
            connection_class=valkey.SSLConnection,
            ssl_ca_certs=config.tls_ca_file,
            ssl_check_hostname=True,
        )
    return valkey.ConnectionPool(**kwargs)


class EngineLink:
    def __init__(
        self,
        config: NetworkTierConfig,
        on_back: Callable[[], None],
        retry_interval_s: float = RETRY_INTERVAL_S,
    ):
        self.url = config.url
        self.timeout_s = config.timeout_s
        self._pool = connection_pool(config)
        self.client = valkey.Valkey(connection_pool=self._pool)
        self.up = True
        self.full = False  # the engine refuses writes (OOM)
        self._on_back = on_back  # the engine check, before the link is up again
        self._retry_interval_s = retry_interval_s
        self._lock = threading.Lock()
        self._down_since = 0.0
        self._failed_meanwhile = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._watch = threading.Thread(
            target=self._watch_loop, name="uma-kv-net-watch", daemon=True
        )
        self._watch.start()

    # -- from any thread --------------------------------------------------

    def went_down(self, exc: BaseException, what: str) -> None:
        """``what`` failed for want of an answer: one warning per episode."""
        with self._lock:
            if not self.up:
                self._failed_meanwhile += 1
                return
            self.up = False
            self._down_since = time.monotonic()
            self._failed_meanwhile = 1
        logger.warning(
            "network KV tier: the engine at %s did not answer (%s: %s, during %s): its blocks "
            "are misses, recomputed, until it answers again; trying every %.0f s.",
            self.url,
            type(exc).__name__,
            exc,
            what,
            self._retry_interval_s,
        )
        self._pool.disconnect(inuse_connections=False)  # sockets of a gone engine
        self._wake.set()

    def refused_write(self, exc: BaseException) -> None:
        """A write came back with an OOM error: the engine is full."""
        with self._lock:
            if self.full:
                return
            self.full = True
        logger.warning(
            "network KV tier: the engine at %s is full and refuses writes (%s): blocks are not "
            "stored there until it takes writes again. Give it maxmemory-policy allkeys-lru "
            "(CONFIG SET maxmemory-policy allkeys-lru).",
            self.url,
            exc,
        )

    def took_write(self) -> None:
        if self.full:
            with self._lock:
                was_full, self.full = self.full, False
            if was_full:
                logger.info("network KV tier: the engine at %s takes writes again.", self.url)

    def fail_fast(self) -> bool:
        """True while the link is down: the caller fails without a round trip."""
        if self.up:
            return False
        with self._lock:
            self._failed_meanwhile += 1
        return True

    # -- the watch thread ---------------------------------------------------

    def _watch_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self.up and not self._stopping.wait(self._retry_interval_s):
                if self._answers():
                    self._back()

    def _answers(self) -> bool:
        try:
            self.client.ping()
            self._on_back()
        except LINK_ERRORS:
            self._pool.disconnect(inuse_connections=False)
            return False
        except Exception:  # the check itself failed: retried, never the thread's end
            logger.exception("network KV tier: checking the engine at %s failed", self.url)
            return False
        return True

    def _back(self) -> None:
        with self._lock:
            self.up = True
            gone_s = time.monotonic() - self._down_since
            failed = self._failed_meanwhile
        logger.info(
            "network KV tier: the engine at %s answers again after %.1f s (%d operations "
            "failed meanwhile, as misses).",
            self.url,
            gone_s,
            failed,
        )

    def start_down(self, exc: BaseException) -> None:
        """At start-up: the engine does not answer yet; serve without it."""
        self.went_down(exc, "the start-up check")

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._watch.join(timeout=self._retry_interval_s + 1.0)
        self._pool.disconnect()
