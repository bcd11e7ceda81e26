"""The network tier's share of its KV server, in its start-up line: counted,
bounded, and never a failed start, on a real valkey-server. A SCAN that
returns a name twice: tests/unit/test_network_tier_usage_scan.py."""

from __future__ import annotations

import pytest
from network_tier_kit import make_tier, started_kv_server

from tests.unit.disk_tier_kit import NS, OTHER_NS, InfoLog, Primary, WarningLog, key
from vllm_uma.kv_offload.mac_keys import parse_keys
from vllm_uma.kv_offload.network import server_check, server_link, server_usage
from vllm_uma.kv_offload.network import tier as tier_module
from vllm_uma.kv_offload.network.value_format import value_name

MAXMEMORY = 4 << 20
LRU = ("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "allkeys-lru")
INFO = {"model": "org/model-one", "kv_dtype": "bfloat16", "groups": ["not kept"]}


@pytest.fixture
def kv_server(tmp_path):
    kv_server = started_kv_server(tmp_path, *LRU)
    yield kv_server
    kv_server.stop()


def fill(kv_server, ns: bytes, count: int, nbytes: int = 10000) -> int:
    """``count`` values under block names of ``ns``; their MEMORY USAGE."""
    client = kv_server.client()
    for i in range(count):
        client.set(value_name(ns, key(i)), bytes(nbytes))
    return sum(client.memory_usage(value_name(ns, key(i))) for i in range(count))


def start_line(kv_server, **kw) -> str:
    with InfoLog(tier_module.logger) as log:
        tier = make_tier(kv_server, Primary(), NS, namespace_info=INFO, **kw)
    tier.shutdown()
    (line,) = [m for m in log.messages if "KV offloading: network tier at" in m]
    return line


def test_the_start_up_line_gives_our_blocks_and_their_share_of_maxmemory(kv_server):
    ours = fill(kv_server, NS, 12)
    fill(kv_server, OTHER_NS, 30)  # another namespace's: not ours to count
    kv_server.client().set(b"app:big", bytes(200000))
    line = start_line(kv_server)
    assert f"namespace {NS.hex()}: 12 blocks, {ours / 2**30:.2f} GiB, " in line
    assert f"{ours / MAXMEMORY:.1%} of maxmemory; values signed with key id " in line
    assert "at least" not in line


def test_a_count_cut_short_says_at_least(kv_server, monkeypatch):
    fill(kv_server, NS, 64, nbytes=10)
    monkeypatch.setattr(server_usage, "SCAN_BATCH", 1)
    monkeypatch.setattr(server_check, "COUNT_MAX_KEYS", 2)
    line = start_line(kv_server)
    blocks = int(line.split(": at least ")[1].split()[0])
    assert 2 <= blocks < 64
    assert "of maxmemory (counting stops at 1 s or 2 names); values signed" in line


def test_a_count_stops_at_its_deadline(kv_server, monkeypatch):
    fill(kv_server, NS, 64, nbytes=10)
    monkeypatch.setattr(server_usage, "SCAN_BATCH", 1)
    monkeypatch.setattr(server_check, "COUNT_DEADLINE_S", 0.0)
    assert ": at least " in start_line(kv_server)


def test_a_kv_server_gone_during_the_count_is_a_line_not_a_failed_start(kv_server, monkeypatch):
    fill(kv_server, NS, 3)
    real = server_check.namespace_usage

    def dies_first(client, *args):
        kv_server.stop()
        return real(client, *args)

    monkeypatch.setattr(server_check, "namespace_usage", dies_first)
    with WarningLog(server_link.logger) as warned, InfoLog(tier_module.logger) as log:
        tier = make_tier(kv_server, Primary(), NS, namespace_info=INFO)
    try:
        assert not tier._link.up  # the link watches for it, as for any gone KV server
        assert any("counting the namespace's blocks" in m for m in warned.messages)
        assert any(
            "its blocks not counted: the KV server stopped answering" in m for m in log.messages
        )
    finally:
        tier.shutdown()


def test_an_acl_that_may_not_count_is_a_phrase_in_the_line(kv_server, monkeypatch):
    kv_server.client().acl_setuser(
        "kv", enabled=True, passwords=["+pw-of-kv"], keys=["vllm-uma:*"],
        commands=["+@all", "-memory"],
    )  # fmt: skip
    monkeypatch.setenv("TEST_KV_PASSWORD", "pw-of-kv")
    fill(kv_server, NS, 2)
    url = f"valkey://kv@127.0.0.1:{kv_server.port}/0"
    line = start_line(kv_server, url=url, password_env="TEST_KV_PASSWORD")
    assert "its blocks not counted (User kv has no permissions" in line
    assert "+scan +memory|usage" in line


def test_the_start_up_line_says_which_key_signs_and_never_the_secret(kv_server, tmp_path):
    secret = tmp_path / "kv.secret"
    previous, current = "5" * 64, "6" * 64
    secret.write_text(f"{current}\n{previous}\n")
    secret.chmod(0o600)
    line = start_line(kv_server, secret_file=str(secret))
    key_id = parse_keys(current, "x").signing.id.hex()
    assert line.endswith(
        f"; values signed with key id {key_id}, 1 previous key(s) accepted for reads."
    )
    assert current not in line and previous not in line and str(secret) not in line


def test_the_start_up_line_says_the_user_chose_unsigned_values(kv_server):
    line = start_line(kv_server, unsigned=True)
    assert '; values unsigned by the user\'s choice ("unsigned": true): anyone who can ' in line
