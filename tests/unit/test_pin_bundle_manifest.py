"""A bundle's manifest and block checks (pins/bundle.py), on JSON and bytes
in memory; export and import on real stores:
tests/integration/test_pin_bundles.py."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest

from vllm_uma.kv_offload.disk.block_file import HEADER_BYTES, checksum, pack_header
from vllm_uma.kv_offload.pins.bundle import (
    BundleBlock,
    BundleError,
    Manifest,
    check_block,
    read_manifest,
)

NS = b"\x11" * 16
KEYS = [bytes([k]) * 36 for k in range(1, 4)]
PAYLOAD = 100


def block_file(key: bytes, ns: bytes = NS, fill: int = 7) -> bytes:
    payload = bytes([fill]) * PAYLOAD
    header = pack_header(key, ns, checksum(memoryview(payload)), PAYLOAD)
    try:
        return bytes(header) + payload
    finally:
        header.close()


def good() -> dict:
    files = [block_file(k) for k in KEYS[:2]]
    return {
        "format": "vllm-uma-kv-bundle",
        "version": 1,
        "namespace": {"id": NS.hex(), "info": {"model": "org/m", "kv_dtype": "bfloat16"}},
        "pin": {"name": "system", "tokens": 48, "ttl_s": 60.5, "keys": [k.hex() for k in KEYS]},
        "block_bytes": HEADER_BYTES + PAYLOAD,
        "blocks": [
            {"key": k.hex(), "size": len(f), "sha256": hashlib.sha256(f).hexdigest()}
            for k, f in zip(KEYS, files, strict=False)
        ],
    }


def changed(path: str, value) -> dict:
    """good() with the value at ``path`` (dotted, list indices as numbers)
    set, or removed if ``value`` is ``...``."""
    data = copy.deepcopy(good())
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def test_a_good_manifest_is_read_and_written_back_the_same():
    manifest = Manifest.from_json(good())
    assert manifest.namespace == NS and manifest.model == "org/m"
    assert manifest.pin.keys == tuple(KEYS) and manifest.pin.ttl_s == 60.5
    assert [b.key for b in manifest.blocks] == KEYS[:2]
    assert manifest.as_json() == good()
    assert Manifest.from_json(changed("pin.ttl_s", None)).pin.ttl_s is None


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("extra", 1, "unknown key(s) ['extra']"),
        ("blocks", ..., "lacks ['blocks']"),
        ("pin.keys", ..., "pin has unknown key(s) [] and lacks ['keys']"),
        ("format", "tarball", "is not a vllm-uma KV bundle"),
        ("version", 2, "bundle format version 2: this vllm-uma reads version 1"),
        ("namespace.id", "11" * 15, "namespace.id='" + "11" * 15),
        ("namespace.id", "AB" * 16, "lower-case hex"),
        ("namespace.info", [], "namespace.info must be an object"),
        ("pin.name", "../etc", "pin: pin name '../etc' is not valid"),
        ("pin.ttl_s", -1, "pin: ttl_s -1 is not valid"),
        ("pin.tokens", True, "pin.tokens=True is invalid"),
        ("pin.keys", [], "pin.keys must be a non-empty list"),
        ("pin.keys.1", KEYS[0].hex(), "names a block twice"),
        ("block_bytes", 10, "block_bytes=10 is invalid"),
        ("blocks", [], "blocks must be a list of 1 to 3 blocks"),
        ("blocks.1.key", KEYS[2].hex(), "is not the pin's block 1"),
        ("blocks.0.size", 4095, "blocks[0].size=4095 is invalid"),
        ("blocks.0.sha256", "AB" * 32, "is not 64 lower-case hex digits"),
        ("blocks.0.sha256", ..., "blocks[0] has unknown key(s) [] and lacks ['sha256']"),
    ],
)
def test_a_manifest_off_its_format_is_refused_naming_what(path, value, words):
    with pytest.raises(BundleError) as refused:
        Manifest.from_json(changed(path, value))
    assert words in str(refused.value)


def test_more_blocks_than_the_pin_has_are_refused():
    data = good()
    data["pin"]["keys"] = data["pin"]["keys"][:1]
    with pytest.raises(BundleError, match="blocks must be a list of 1 to 1 blocks"):
        Manifest.from_json(data)


def test_read_manifest_refuses_what_is_not_a_json_file(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="is not JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "real.json").write_text(json.dumps(good()))
    os.symlink(tmp_path / "real.json", tmp_path / "manifest.json")
    with pytest.raises(BundleError, match="cannot be opened"):  # never followed
        read_manifest(tmp_path)
    os.unlink(tmp_path / "manifest.json")
    os.rename(tmp_path / "real.json", tmp_path / "manifest.json")
    assert read_manifest(tmp_path).pin.name == "system"


def test_check_block_wants_the_size_the_sha256_and_the_stores_header():
    data = block_file(KEYS[0])
    block = BundleBlock(KEYS[0], len(data), hashlib.sha256(data).hexdigest())
    check_block(data, "b", block, NS)  # sound
    with pytest.raises(BundleError, match="is 4195 bytes, not the 4196 listed"):
        check_block(data[:-1], "b", block, NS)
    flipped = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(BundleError, match="does not match the manifest"):
        check_block(flipped, "b", block, NS)
    resummed = BundleBlock(KEYS[0], len(data), hashlib.sha256(flipped).hexdigest())
    with pytest.raises(BundleError, match="corrupted: payload checksum mismatch"):
        check_block(flipped, "b", resummed, NS)
    with pytest.raises(BundleError, match=f"foreign: namespace {NS.hex()}"):
        check_block(data, "b", block, b"\x22" * 16)
    other = BundleBlock(KEYS[1], len(data), block.sha256)
    with pytest.raises(BundleError, match="foreign: written for another key"):
        check_block(data, "b", other, NS)
