"""What the network tier keeps in the KV server: key names and values.

Used on the network tier's threads (engine-core process); nothing here
touches the network. A value is byte for byte a disk-tier block file
(disk/block_file.py): the 4096-byte header page (magic, format version,
namespace id, the key, the CRC-32C and length of the payload), then one
primary-tier row. So the checks are the disk tier's: a value of another
namespace, key or format, a flipped byte or a cut value is a ``BadBlock``,
never copied into a row. The page of header costs 0.6% of a 737,280-byte
block of the default model; in return a value and a block file are the
same bytes, and one reader checks both.

Those checks catch accidents, not a writer who means harm: anyone can
compute a CRC, and a known prefix has a known key. So a value also carries
the fleet's MAC in its header page (block_mac.py), made with the secret
only the fleet's hosts hold, and a value without a valid one is a
``BadBlock`` too. ``keys`` None is the user's choice of unsigned values
(``"unsigned": true``): none is written, none is checked.

Key names::

    vllm-uma:kv:<namespace hex>:{<block hash hex>}:<group index hex>

The ``{...}`` is a cluster hash tag: a Valkey/Redis Cluster places a key by
the CRC16 of the tagged part only. Tagged by the block's hash, every KV
group of one block position (a sliding-window model keeps one key per
group) lands on one node, and consecutive positions spread over every node:
the cluster's memory and bandwidth add up for one model, and a prefix is
fetched with one pipelined round trip per node, all nodes at once. Tagging
by the namespace would put a whole model on one node; tagging by the
prefix's first block is not possible, since a key (a chained hash) does not
say which prefix it ends, and lookups arrive one key at a time.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import get_offload_block_hash, get_offload_group_idx

from vllm_uma.kv_offload import block_mac
from vllm_uma.kv_offload.disk.block_file import (
    HEADER_BYTES,
    BadBlock,
    BadReason,
    check_header,
    checksum,
    pack_header,
)
from vllm_uma.kv_offload.mac_keys import KeyRing
from vllm_uma.kv_offload.network.key_names import NAME_PREFIX


def value_name(namespace: bytes, key: bytes) -> bytes:
    """The KV server's key for block ``key`` of ``namespace``."""
    block_hash, group = get_offload_block_hash(key), get_offload_group_idx(key)
    return f"{NAME_PREFIX}{namespace.hex()}:{{{block_hash.hex()}}}:{group:x}".encode()


def namespace_pattern(namespace: bytes) -> bytes:
    """A SCAN MATCH pattern for every key of ``namespace``."""
    return f"{NAME_PREFIX}{namespace.hex()}:*".encode()


def value_bytes(row_bytes: int) -> int:
    return HEADER_BYTES + row_bytes


def pack_value(
    key: bytes, namespace: bytes, row: memoryview, *, keys: KeyRing | None
) -> memoryview:
    """The value for ``row``: header page + a copy of the row (one memcpy;
    the client sends a memoryview without copying it again), signed with
    ``keys``' signing key unless ``keys`` is None."""
    value = bytearray(value_bytes(row.nbytes))
    value[HEADER_BYTES:] = row
    view = memoryview(value)
    payload = view[HEADER_BYTES:]
    # The checksum and the tag of the copy that is sent, not of the row,
    # which another thread may be overwriting once vLLM has moved on.
    header = pack_header(key, namespace, checksum(payload), row.nbytes)
    try:
        value[:HEADER_BYTES] = header
    finally:
        header.close()
    if keys is not None:
        block_mac.sign(view[:HEADER_BYTES], payload, keys)
    return view


def unpack_value(
    value: bytes,
    name: bytes,
    key: bytes,
    namespace: bytes,
    row: memoryview,
    *,
    keys: KeyRing | None,
) -> None:
    """Fill ``row`` with the payload of ``value``, or raise BadBlock (and
    leave ``row`` untouched): every field is checked, and the tag with
    ``keys`` unless it is None, before a byte is copied."""
    where = name.decode()
    expected = value_bytes(row.nbytes)
    if len(value) < expected:
        raise BadBlock(BadReason.TRUNCATED, where, f"{len(value)} bytes, expected {expected}")
    if len(value) > expected:
        raise BadBlock(BadReason.CORRUPTED, where, f"{len(value)} bytes, expected {expected}")
    view = memoryview(value)
    payload = view[HEADER_BYTES:]
    check_header(view[:HEADER_BYTES], where, key, namespace, payload)
    if keys is not None:
        block_mac.verify(view[:HEADER_BYTES], payload, keys, where)
    row[:] = payload
