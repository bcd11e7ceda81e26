"""A KV block's MAC: proof that a host holding the fleet's secret wrote it.

Used by the network tier's transfer threads (engine-core process) on every
value written and read. A block's CRC-32C and namespace (block_file.py)
catch honest damage, but anyone can compute them: the key is vLLM's sha256
chain from a public seed, so a known prefix (a system prompt) has a known
name, and whoever can write to the engine could plant KV that every host
serves. The tag is a keyed MAC over the whole header page and the payload,
with a key only the fleet's hosts hold (mac_keys.py); a value without a
valid tag is never copied into a row.

The tag lives in the header page's padding, so a signed value is still a
block file byte for byte (a reader that does not check tags sees nothing
new)::

    offset  size  field
    0       40+K  the block file's header (block_file.py; K <= 112, so it ends by 152)
    256     8     MAC magic b"UMAMAC" + version u8 + algorithm u8 (1: HMAC-SHA256)
    264     8     key id (mac_keys.py): which of the fleet's keys signed it
    272     32    tag = MAC(key, header[0:272] + header[304:4096] + payload)
    304     ...   zero padding
    4096    P     payload

The tag covers the magic and the key id too: a value cannot be moved to
another key's id, nor its padding changed, without a new tag.

Why HMAC-SHA256 (hashlib, OpenSSL): measured on this machine (AMD EPYC,
2 cores shared, SHA-NI and AVX2, no AVX-512), one thread, hot, best of 7,
``python -m tools.benchmark.mac_cost``, per block of the default model in
bfloat16 (32 tokens: 737,280 B) and of Qwen3-0.6B (32 tokens: 3,670,016 B):

    MAC (32-byte key)     737,280 B        3,670,016 B
    crc32c (reference)    ...
    HMAC-SHA256           ...
    keyed BLAKE2b         ...
    keyed BLAKE3          ...

(filled in below by the measurement; see docs/network_tier.md, "What a tag costs")
"""

from __future__ import annotations

import hmac
import struct

from vllm_uma.kv_offload.disk.block_file import (
    FIXED_HEADER,
    HEADER_BYTES,
    MAX_KEY_BYTES,
    BadBlock,
    BadReason,
)
from vllm_uma.kv_offload.mac_keys import KEY_ID_BYTES, KeyRing

MAC_AT = 256
MAC_VERSION = 1
ALGORITHM_HMAC_SHA256 = 1
MAGIC = b"UMAMAC" + bytes([MAC_VERSION, ALGORITHM_HMAC_SHA256])
TAG_BYTES = 32
# magic, key id, tag
MAC_FIELDS = struct.Struct(f"<8s{KEY_ID_BYTES}s{TAG_BYTES}s")
TAG_AT = MAC_AT + 8 + KEY_ID_BYTES
TAG_END = TAG_AT + TAG_BYTES
assert FIXED_HEADER.size + MAX_KEY_BYTES <= MAC_AT and TAG_END <= HEADER_BYTES


def _tag(material: bytes, header, payload) -> bytes:
    """The MAC of everything but the tag's own bytes. OpenSSL's HMAC
    releases the GIL on large updates: two transfer threads sign at once."""
    mac = hmac.new(material, memoryview(header)[:TAG_AT], "sha256")
    mac.update(memoryview(header)[TAG_END:HEADER_BYTES])
    mac.update(payload)
    return mac.digest()


def sign(header, payload, keys: KeyRing) -> None:
    """Write the magic, the signing key's id and the tag into ``header``
    (a writable header page whose other fields are final)."""
    key = keys.signing
    MAC_FIELDS.pack_into(header, MAC_AT, MAGIC, key.id, bytes(TAG_BYTES))
    header[TAG_AT:TAG_END] = _tag(key.material, header, payload)


def verify(header, payload, keys: KeyRing, where: str) -> None:
    """Raise BadBlock unless ``header``'s tag is a valid MAC of this header
    and ``payload`` by one of ``keys``: unsigned (no tag, or another MAC
    format), unknown_key (a key this server lacks: another fleet's, or a
    rotation this host has not caught up with), forged (a tag that does not
    match: made without the key, or the value changed since)."""
    magic, key_id, tag = MAC_FIELDS.unpack_from(header, MAC_AT)
    if magic != MAGIC:
        raise BadBlock(BadReason.UNSIGNED, where, "no MAC tag (written without the secret)")
    key = keys.accepted.get(key_id)
    if key is None:
        raise BadBlock(
            BadReason.UNKNOWN_KEY,
            where,
            f"signed with key id {key_id.hex()}, which this server does not hold (give every "
            f"host the same secret; while a rotation is under way, the new key on a second line)",
        )
    if not hmac.compare_digest(_tag(key.material, header, payload), tag):
        raise BadBlock(BadReason.FORGED, where, f"MAC tag mismatch (key id {key_id.hex()})")
