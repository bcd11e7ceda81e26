"""The network tier over TLS (``valkeys://``) to a real KV server that serves
TLS only: Debian's redis-server (tools/harness/tls_server.py; PyPI's
valkey-server has no TLS), with a CA and certificates made for the module
(tools/harness/certificates.py). A block round-trips; a wrong CA, a
certificate for another host, a missing client certificate, a plain url
to the TLS port and a TLS url to a plain KV server each refuse the start
with the reason and the fix, at once."""

from __future__ import annotations

import time

import pytest
from network_tier_kit import answered_lookup, make_tier, started_kv_server, started_tls_kv_server
from vllm.v1.kv_offload.base import LookupResult

from tests.unit.disk_tier_kit import NS, Jobs, Primary, key
from tools.harness.certificates import make_certificates
from vllm_uma.commands import main as cli
from vllm_uma.kv_offload.network.server_check import ServerRefused

LRU = ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
CONNECT_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def kv_server(tmp_path_factory, certs):
    """TLS only (no plain port), asks no client certificate."""
    kv_server = started_tls_kv_server(tmp_path_factory.mktemp("tls"), certs, *LRU)
    yield kv_server
    kv_server.stop()


@pytest.fixture
def primary():
    return Primary()


def refusal(kv_server, primary, **settings) -> tuple[str, float]:
    """The start's refusal and how long it took."""
    start = time.monotonic()
    with pytest.raises(ServerRefused) as err:
        tier = make_tier(kv_server, primary, NS, connect_timeout_s=CONNECT_TIMEOUT_S, **settings)
        tier.shutdown()  # not reached when the test passes
    return str(err.value), time.monotonic() - start


def test_a_block_round_trips_over_tls_with_the_password(kv_server, certs, primary, monkeypatch):
    client = kv_server.client()
    client.config_set("requirepass", "pw-over-tls")
    monkeypatch.setenv("TEST_KV_PASSWORD", "pw-over-tls")
    try:
        tier = make_tier(
            kv_server, primary, NS, tls_ca_file=str(certs.ca), password_env="TEST_KV_PASSWORD"
        )
        try:
            assert tier._link.up
            jobs = Jobs(tier)
            data = [primary.fill(row, seed=row + 3) for row in range(2)]
            assert jobs.stored([key(0), key(1)], [0, 1]).success
            primary.clear()
            assert answered_lookup(tier, key(1)) is LookupResult.HIT
            assert jobs.loaded([key(0), key(1)], [2, 3]).success
            assert [primary.row(2), primary.row(3)] == data
        finally:
            tier.shutdown()
        # The KV server has no plain port: what it holds came over TLS.
        assert client.info("keyspace")["db0"]["keys"] >= 2
    finally:
        client.config_set("requirepass", "")


def test_a_wrong_ca_refuses_the_start_naming_the_ca_and_the_fix(kv_server, certs, primary):
    message, seconds = refusal(kv_server, primary, tls_ca_file=str(certs.other_ca))
    assert "does not verify against" in message and str(certs.other_ca) in message
    assert "set tls_ca_file to the PEM file of the CA" in message
    assert seconds < 2.0


def test_the_system_cas_do_not_trust_a_private_ca(kv_server, primary):
    message, _ = refusal(kv_server, primary)
    assert "does not verify against the system's CAs" in message


def test_a_certificate_for_another_host_refuses_the_start(tmp_path, certs, primary):
    # Reached at 127.0.0.2, which its certificate (127.0.0.1, localhost) does not name.
    kv_server = started_tls_kv_server(tmp_path, certs, "--bind", "127.0.0.1", "127.0.0.2")
    try:
        url = f"valkeys://127.0.0.2:{kv_server.port}/0"
        message, _ = refusal(kv_server, primary, url=url, tls_ca_file=str(certs.ca))
        assert "not valid for the host it was reached by" in message
        assert "127.0.0.2" in message and "subjectAltName" in message
    finally:
        kv_server.stop()


def test_a_kv_server_that_asks_for_a_client_certificate(tmp_path, certs, primary):
    kv_server = started_tls_kv_server(tmp_path, certs, *LRU, clients_need_certs=True)
    try:
        message, _ = refusal(kv_server, primary, tls_ca_file=str(certs.ca))
        assert "asks for a client certificate" in message
        assert "tls_cert_file and tls_key_file" in message
        tier = make_tier(
            kv_server,
            primary,
            NS,
            tls_ca_file=str(certs.ca),
            tls_cert_file=str(certs.client_cert),
            tls_key_file=str(certs.client_key),
        )
        try:
            data = primary.fill(0, seed=9)
            jobs = Jobs(tier)
            assert jobs.stored([key(5)], [0]).success
            assert jobs.loaded([key(5)], [1]).success and primary.row(1) == data
        finally:
            tier.shutdown()
    finally:
        kv_server.stop()


def test_a_plain_url_to_a_tls_port_refuses_the_start_with_the_scheme_to_use(kv_server, primary):
    message, seconds = refusal(kv_server, primary, url=f"valkey://127.0.0.1:{kv_server.port}/0")
    assert "serves TLS only" in message and "Use valkeys://" in message
    assert seconds < 2.0


def test_a_tls_url_to_a_plain_kv_server_refuses_the_start_within_the_connect_timeout(
    tmp_path, certs, primary
):
    plain = started_kv_server(tmp_path, *LRU)
    try:
        url = f"valkeys://127.0.0.1:{plain.port}/0"
        message, seconds = refusal(plain, primary, url=url, tls_ca_file=str(certs.ca))
        assert "serves plain connections" in message and "valkey://" in message
        # One unanswered handshake and one PING: no hang, no 2 s command timeout.
        assert seconds < CONNECT_TIMEOUT_S + 1.0
    finally:
        plain.stop()


def test_kv_store_reaches_a_tls_kv_server_and_says_why_a_wrong_ca_fails(kv_server, certs, capsys):
    assert cli.main(["kv-store", kv_server.url, "du", "--tls-ca-file", str(certs.ca)]) == 0
    capsys.readouterr()
    status = cli.main(["kv-store", kv_server.url, "ls", "--tls-ca-file", str(certs.other_ca)])
    assert status == 3
    assert "does not verify against" in capsys.readouterr().err
