"""The network tier (vllm_uma/kv_offload/network/) against a real valkey-server:
round trips of row bytes, values that must not be served, lookups.
The KV server's faults and set-ups are in test_network_tier_server.py."""

from __future__ import annotations

import struct

import crc32c
import pytest
from network_tier_kit import answered_lookup, make_tier, started_kv_server
from vllm.v1.kv_offload.base import Locality, LookupResult, ReqContext

from tests.unit.disk_tier_kit import CTX, NS, OTHER_NS, Jobs, Primary, WarningLog, counters, key
from tests.unit.kv_secret_kit import KEYS
from vllm_uma.kv_offload import block_mac, mac_keys
from vllm_uma.kv_offload.disk.block_file import HEADER_BYTES, MAGIC
from vllm_uma.kv_offload.mac_keys import parse_keys
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network import tier as tier_module
from vllm_uma.kv_offload.network.value_format import pack_value, value_name

OTHER_KEYS = parse_keys("9" * 64, "another fleet's secret")


@pytest.fixture(scope="module")
def kv_server(tmp_path_factory):
    kv_server = started_kv_server(tmp_path_factory.mktemp("valkey"), "--maxmemory", "64mb",
                    "--maxmemory-policy", "allkeys-lru")  # fmt: skip
    yield kv_server
    kv_server.stop()


@pytest.fixture
def primary():
    return Primary()


@pytest.fixture
def tier(kv_server, primary):
    kv_server.client().flushall()
    tier = make_tier(kv_server, primary, NS)
    yield tier
    tier.shutdown()


def test_stored_rows_come_back_byte_for_byte(kv_server, tier, primary):
    jobs = Jobs(tier)
    keys = [key(i) for i in range(3)]
    data = [primary.fill(row, seed=row + 1) for row in range(3)]
    assert jobs.stored(keys, [0, 1, 2]).success
    # The value is a block file's bytes, under the tagged name.
    raw = kv_server.client().get(value_name(NS, keys[1]))
    assert raw[: len(MAGIC)] == MAGIC and raw[HEADER_BYTES:] == data[1]
    assert b"{" + keys[1][:-4].hex().encode() + b"}" in value_name(NS, keys[1])
    primary.clear()
    assert [answered_lookup(tier, k) for k in keys] == [LookupResult.HIT] * 3
    result = jobs.loaded(keys, [5, 6, 7])
    assert result.success and result.transfer_bytes == 3 * len(data[0])
    assert [primary.row(r) for r in (5, 6, 7)] == data
    stats = counters(tier.get_stats())
    assert stats[(m.NAMES.written_blocks, ())] == 3 and stats[(m.NAMES.read_blocks, ())] == 3
    assert stats[(m.NAMES.lookup_hits, ())] == 3


def test_a_lookup_is_retry_until_the_lookup_thread_answered(tier):
    ctx = ReqContext(req_id="fresh")
    assert tier.lookup(key(40), ctx) is LookupResult.RETRY  # no round trip here
    assert answered_lookup(tier, key(40), ctx) is LookupResult.MISS


def test_another_namespace_does_not_see_our_blocks(kv_server, tier, primary):
    primary.fill(0, seed=9)
    assert Jobs(tier).stored([key(1)], [0]).success
    other = make_tier(kv_server, primary, OTHER_NS)
    try:
        assert answered_lookup(other, key(1)) is LookupResult.MISS
    finally:
        other.shutdown()


def test_a_store_of_a_block_just_stored_is_skipped(tier, primary):
    primary.fill(0, seed=3)
    jobs = Jobs(tier)
    assert jobs.stored([key(1)], [0]).success
    assert jobs.stored([key(1)], [0]).success
    assert counters(tier.get_stats())[(m.NAMES.store_skipped, ())] == 1


def _bad_value_is_a_counted_miss(kv_server, tier, primary, spoil, reason):
    jobs = Jobs(tier)
    good = primary.fill(0, seed=5)
    assert jobs.stored([key(1)], [0]).success
    name = value_name(NS, key(1))
    spoil(kv_server.client(), name, good)
    primary.fill(3, seed=77)
    before = primary.row(3)
    with WarningLog(tier_module.logger) as log:
        assert answered_lookup(tier, key(1)) is LookupResult.HIT  # it exists
        result = jobs.loaded([key(1)], [3])
    assert not result.success and not result.successful_keys
    assert primary.row(3) == before  # nothing of a bad value lands in a row
    stats = counters(tier.get_stats())
    assert stats[(m.NAMES.bad_values, (reason,))] == 1
    assert stats[(m.LOAD_MISSES, (reason,))] == 1
    assert kv_server.client().exists(name) == 0  # deleted: no lookup finds it again
    # The request's verdict turned to a miss: vLLM does not try again.
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    assert len(log.messages) == 1 and reason in log.messages[0]


def test_a_value_of_another_namespace_under_our_name_is_a_counted_miss(kv_server, tier, primary):
    def foreign(client, name, good):
        client.set(name, pack_value(key(1), OTHER_NS, memoryview(good), keys=KEYS))

    _bad_value_is_a_counted_miss(kv_server, tier, primary, foreign, "foreign")


def test_a_flipped_byte_is_a_counted_miss(kv_server, tier, primary):
    def flip(client, name, good):
        at = HEADER_BYTES + 100
        client.setrange(name, at, bytes([good[100] ^ 0x01]))

    _bad_value_is_a_counted_miss(kv_server, tier, primary, flip, "corrupted")


def test_a_truncated_value_is_a_counted_miss(kv_server, tier, primary):
    def cut(client, name, good):
        client.set(name, client.get(name)[:-10])

    _bad_value_is_a_counted_miss(kv_server, tier, primary, cut, "truncated")


# -- the fleet's MAC: values anyone could write are never served ------------


def test_a_forged_value_with_a_right_crc_and_namespace_but_no_tag_is_a_counted_miss(
    kv_server, tier, primary
):
    # What another tenant of the KV server can write: every field a reader
    # checks without the secret is right (docs/network_tier.md).
    def forge(client, name, good):
        forged = memoryview(bytes(len(good)))  # other KV: zeros
        client.set(name, pack_value(key(1), NS, forged, keys=None))

    _bad_value_is_a_counted_miss(kv_server, tier, primary, forge, "unsigned")


def test_a_value_changed_after_signing_is_a_counted_miss(kv_server, tier, primary):
    def change(client, name, good):
        value = bytearray(client.get(name))
        value[HEADER_BYTES + 100] ^= 0x01
        struct.pack_into("<I", value, 12, crc32c.crc32c(value[HEADER_BYTES:]))  # CRC made right
        client.set(name, bytes(value))

    _bad_value_is_a_counted_miss(kv_server, tier, primary, change, "forged")


def test_a_value_signed_with_a_key_this_server_lacks_is_a_counted_miss(kv_server, tier, primary):
    def other_fleet(client, name, good):
        client.set(name, pack_value(key(1), NS, memoryview(good), keys=OTHER_KEYS))

    _bad_value_is_a_counted_miss(kv_server, tier, primary, other_fleet, "unknown_key")


def _secret(path, *keys: str):
    path.write_text("".join(k + "\n" for k in keys))
    path.chmod(0o600)
    return str(path)


def test_a_rotation_reads_the_previous_keys_values_and_signs_with_the_new_one(
    kv_server, primary, tmp_path, monkeypatch
):
    monkeypatch.setattr(mac_keys, "RELOAD_CHECK_S", 0.0)
    old, new = "0a" * 32, "0b" * 32
    secret = tmp_path / "kv.secret"
    before = make_tier(kv_server, primary, NS, secret_file=_secret(secret, old))
    try:
        data = primary.fill(0, seed=31)
        assert Jobs(before).stored([key(1)], [0]).success
        # Every host's file gets the new key first (no restart: the tier
        # reads the file again), then it is moved before the old one.
        _secret(secret, new, old)
        primary.fill(1, seed=32)
        assert Jobs(before).stored([key(2)], [1]).success
        value = kv_server.client().get(value_name(NS, key(2)))
        assert value[block_mac.MAC_AT + 8 : block_mac.TAG_AT] == parse_keys(new, "x").signing.id
        primary.clear()
        assert Jobs(before).loaded([key(1)], [3]).success and primary.row(3) == data
    finally:
        before.shutdown()
    # A host holding the new key alone: the old key's value is a miss.
    after = make_tier(kv_server, primary, NS, secret_file=_secret(tmp_path / "new", new))
    try:
        result = Jobs(after).loaded([key(1), key(2)], [4, 5])
        assert list(result.successful_keys) == [key(2)]
        assert counters(after.get_stats())[(m.NAMES.bad_values, ("unknown_key",))] == 1
    finally:
        after.shutdown()


def test_an_unsigned_tier_serves_what_a_signed_one_wrote(kv_server, tier, primary):
    data = primary.fill(0, seed=41)
    assert Jobs(tier).stored([key(1)], [0]).success
    unsigned = make_tier(kv_server, primary, NS, unsigned=True)
    try:
        assert Jobs(unsigned).loaded([key(1)], [2]).success and primary.row(2) == data
    finally:
        unsigned.shutdown()


def test_a_block_gone_since_its_lookup_fails_alone(kv_server, tier, primary):
    jobs = Jobs(tier)
    data = [primary.fill(r, seed=r + 20) for r in range(3)]
    assert jobs.stored([key(1), key(2), key(3)], [0, 1, 2]).success
    kv_server.client().delete(value_name(NS, key(2)))  # evicted meanwhile
    primary.clear()
    result = jobs.loaded([key(1), key(2), key(3)], [4, 5, 6])
    assert not result.success and list(result.successful_keys) == [key(1), key(3)]
    assert primary.row(4) == data[0] and primary.row(6) == data[2]
    assert counters(tier.get_stats())[(m.LOAD_MISSES, ("absent",))] == 1


def test_every_job_gets_exactly_one_result(tier, primary):
    jobs = Jobs(tier)  # its wait() fails on a second result for a job
    for row in range(8):
        primary.fill(row, seed=row)
    ids = [jobs.store([key(100 + i)], [i % 8]) for i in range(20)]
    ids += [jobs.load([key(100 + i)], [i % 8]) for i in range(20)]
    results = jobs.wait(*ids)
    assert len(results) == 40
    assert not tier.has_pending_work()
    assert list(tier.get_finished_jobs()) == []


def test_with_kv_events_stores_are_published_as_a_cache_every_host_reads(kv_server, primary):
    # vllm-router files an event with an ownership under that cache and
    # credits the server that published it (docs/fleet.md).
    kv_server.client().flushall()
    tier = make_tier(kv_server, primary, NS, kv_events=True)
    try:
        primary.fill(0, seed=5)
        assert Jobs(tier).stored([key(1), key(2)], [0, 0]).success
        (event,) = tier.take_events()
        assert event.keys == [key(1), key(2)] and not event.removed
        assert event.ownership == f"valkey://127.0.0.1:{kv_server.port}/0"
        assert event.locality is Locality.REMOTE
        assert list(tier.take_events()) == []  # taken once
        # A damaged value is deleted, and its removal published.
        raw = bytearray(kv_server.client().get(value_name(NS, key(2))))
        raw[-1] ^= 0xFF
        kv_server.client().set(value_name(NS, key(2)), bytes(raw))
        Jobs(tier).loaded([key(2)], [3])
        (removal,) = tier.take_events()
        assert removal.keys == [key(2)] and removal.removed
    finally:
        tier.shutdown()


def test_without_kv_events_nothing_is_published(tier, primary):
    primary.fill(0, seed=6)
    assert Jobs(tier).stored([key(1)], [0]).success
    assert list(tier.take_events()) == []
