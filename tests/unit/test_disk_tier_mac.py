"""Signed block files, the disk tier's option (``secret_file`` in the fs tier):
a file another process of the host wrote without the secret is never served.

The network tier's MAC (block_mac.py) in the same header page; the settings
and the network tier's side are test_network_tier_settings.py's."""

from __future__ import annotations

import struct

import crc32c
import pytest
from disk_tier_kit import NS, ROW, InfoLog, Jobs, Primary, WarningLog, counters, key, make_tier

from vllm_uma.kv_offload import block_mac
from vllm_uma.kv_offload.disk import block_file as bf
from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk import tier as tier_module
from vllm_uma.kv_offload.disk.settings import DiskTierSettingsError, check_disk_tier
from vllm_uma.kv_offload.mac_keys import parse_keys

SECRET = "c0ffee" * 11  # 66 characters


@pytest.fixture
def primary():
    return Primary()


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "kv.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


def block_path(root, k: bytes):
    return bf.block_path(root / ".noindex" / NS.hex(), k)


def forge(path) -> None:
    """What another writer of the directory can make without the secret: other
    KV (zeros) with every field right, the CRC-32C of the zeros, and no tag."""
    with open(path, "r+b") as f:
        header = bytearray(f.read(bf.HEADER_BYTES))
        header[block_mac.MAC_AT : block_mac.TAG_END] = bytes(block_mac.TAG_END - block_mac.MAC_AT)
        struct.pack_into("<I", header, 12, crc32c.crc32c(bytes(ROW)))
        f.seek(0)
        f.write(bytes(header) + bytes(ROW))


def test_a_signed_store_restores_its_own_files_and_says_its_key(tmp_path, primary, secret):
    with InfoLog(tier_module.logger) as log:
        tier = make_tier(tmp_path / "kv", primary, secret_file=secret)
    key_id = parse_keys(SECRET, "x").signing.id
    assert f"Disk KV tier: block files signed with key id {key_id.hex()}." in log.messages
    assert not any(SECRET in line for line in log.messages)
    try:
        data = primary.fill(0, seed=3)
        assert Jobs(tier).stored([key(1)], [0]).success
        tier.drain_jobs()
        with open(block_path(tmp_path / "kv", key(1)), "rb") as f:
            header = f.read(bf.HEADER_BYTES)
        assert header[block_mac.MAC_AT + 8 : block_mac.TAG_AT] == key_id
        primary.clear()
        assert Jobs(tier).loaded([key(1)], [4]).success and primary.row(4) == data
    finally:
        tier.shutdown()


def test_a_file_without_a_valid_tag_is_a_counted_miss_and_removed(tmp_path, primary, secret):
    root = tmp_path / "kv"
    tier = make_tier(root, primary, secret_file=secret)
    try:
        jobs = Jobs(tier)
        data = [primary.fill(row, seed=row + 1) for row in range(2)]
        assert jobs.stored([key(0), key(1)], [0, 1]).success
        tier.drain_jobs()
        forge(block_path(root, key(1)))
        primary.clear()
        with WarningLog() as log:
            result = jobs.loaded([key(0), key(1)], [5, 6])
        assert list(result.successful_keys) == [key(0)] and primary.row(5) == data[0]
        tier.drain_jobs()
        tier.get_finished_jobs()
        assert not block_path(root, key(1)).exists()
        assert counters(tier.get_stats())[(m.NAMES.bad_values, ("unsigned",))] == 1
        assert len(log.messages) == 1 and "unsigned" in log.messages[0]
    finally:
        tier.shutdown()


def test_an_unsigned_tier_serves_the_same_forged_file(tmp_path, primary):
    # The control: without the option, the forged file passes every check.
    root = tmp_path / "kv"
    tier = make_tier(root, primary)
    try:
        primary.fill(0, seed=9)
        assert Jobs(tier).stored([key(1)], [0]).success
        tier.drain_jobs()
        forge(block_path(root, key(1)))
        assert Jobs(tier).loaded([key(1)], [3]).success
        assert primary.row(3) == bytes(ROW)  # the planted KV, served
    finally:
        tier.shutdown()


def test_a_secret_that_cannot_sign_is_refused_with_the_fix(tmp_path):
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    weak.chmod(0o600)
    tier = {"type": "fs", "root_dir": str(tmp_path / "kv")}
    for given, words in (
        ({"secret_file": str(weak)}, "key 1 of secret_file="),
        ({"secret_env": "NOT_SET_ANYWHERE_42"}, "export NOT_SET_ANYWHERE_42="),
        ({"secret_file": "/a", "secret_env": "B"}, "both secret_file and secret_env"),
    ):
        with pytest.raises(DiskTierSettingsError) as err:
            check_disk_tier([{**tier, **given}])
        assert str(err.value).startswith("fs tier: ") and words in str(err.value)
