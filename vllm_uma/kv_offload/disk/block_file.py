"""L3 on-disk format: one file per KV block, its header, its name.

Used wherever a block file is named or checked: the disk tier's I/O threads
and start-up (engine-core process) and ``vllm-uma kv-store`` (the
administrator's process); nothing here touches vLLM or the disk. A block
file holds exactly one primary-tier (L2) row and is named by the block's
``OffloadKey`` (prefix block hash + 4-byte group index), so the same prompt
prefix maps to the same file in every process:

    <namespace_dir>/<first 2 hex of key>/<key hex>.kvb

    offset  size  field
    0       8     magic  b"UMAKVB\\r\\n" (a text-mode copy mangles \\r\\n)
    8       2     format version (little-endian u16)
    10      2     key length K (u16)
    12      4     checksum of the payload (u32): CRC-32C (version 2)
    16      8     payload length P (u64)
    24      16    namespace id (model, dtype, layout: see the spec)
    40      K     key bytes
    40+K    ...   zero padding
    4096    P     payload: one primary-tier row, byte for byte
    4096+P        end of file

The header is padded to a page so that the payload starts page aligned: with
page-aligned primary rows, header and payload move in one O_DIRECT preadv /
pwritev, straight between the disk and the row (block_write.py). Measured here
on a 360 KiB block: an O_DIRECT read costs 72 us of CPU, a buffered one
194 us (the copy and the page-cache bookkeeping), and version 1's zlib
crc32 check about 90 us.

The checksum is CRC-32C (the ``crc32c`` package, on the CPU's crc32
instruction: SSE4.2 on x86, the CRC extension on ARMv8) since format
version 2; version 1's zlib.crc32 was most of a restore's CPU time. It
releases the GIL from 32 KiB up (a real model's block is far larger), so
the I/O threads checksum on every core at once. Measured here (2 shared cores, one busy
with other work), one thread, in GB/s; hot: a block just checksummed,
cold: each block of a 256 MiB set once, as a restore meets them:

    block            zlib.crc32     crc32c.crc32c
                     hot   cold     hot    cold
    2,949,120 B      5.1   2.3      26.5   12.8     (111 us a block, hot)
    14,680,064 B     3.8   2.3      26.7   13.0     (549 us)

``python -m tools.benchmark.checksum_speed``, which also shows the GIL
released. google_crc32c does 5.8-6.8 GB/s here and takes only ``bytes``
(a copy of each block). Without the CPU's instruction
(``crc32c.hardware_based`` False) crc32c falls back to software: 2.3 GB/s
hot here, below zlib.

Files of version 1 are still read, checked with zlib.crc32: they are as
trustworthy as they were, and refusing them would throw a whole store
away at the upgrade (each hit a wasted read, a delete and a recompute,
where a version 1 restore costs one slower check). Nothing writes version
1 any more; such a file stays until it is evicted or deleted. Any other
version is FOREIGN: never served, deleted and counted like any bad block.
That is also what an older vllm-uma sharing the store does with version 2
files: until every server of a store is upgraded, the old ones delete the
new ones' blocks they try to restore (a counted miss, never wrong data).

Writing is block_write.py (atomic, by rename); reading is block_read.py
(nothing under a name trusted, every field checked, or BadBlock).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import crc32c

MAGIC = b"UMAKVB\r\n"
# What this code writes; CHECKSUMS lists what it reads.
FORMAT_VERSION = 2
# The payload checksum of each format version read (module docstring).
CHECKSUMS: dict[int, Callable[[memoryview], int]] = {1: zlib.crc32, 2: crc32c.crc32c}
HEADER_BYTES = 4096
NAMESPACE_BYTES = 16
# magic, version, key length, checksum, payload length, namespace; the key follows.
FIXED_HEADER = struct.Struct("<8sHHIQ16s")
# A key becomes a file name of 2 hex digits per byte + ".kvb", and its temp
# file adds ".<pid>-<12 hex>.tmp" (up to 25 characters): stay under the
# 255-byte name limit of ext4, xfs and btrfs.
MAX_KEY_BYTES = 112
BLOCK_SUFFIX = ".kvb"
TEMP_SUFFIX = ".tmp"

# Errors of the process, not of the file (out of descriptors or memory, a
# signal): a load that meets one is a miss, and the file is kept.
PROCESS_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN})

# How every block file is opened, to read or to write: never through a
# symlink planted under the name, never waiting on a FIFO's open.
SAFE_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BadReason(Enum):
    """Why a block file cannot be served (also the metric label)."""

    MISSING = "missing"  # no file under the name
    TRUNCATED = "truncated"  # shorter than header + payload (torn write, full disk)
    CORRUPTED = "corrupted"  # bad magic, wrong length or checksum mismatch
    FOREIGN = "foreign"  # another namespace, key or a format version not read
    UNREADABLE = "unreadable"  # open or read failed (EIO, EACCES, ...)
    NOT_A_FILE = "not_a_file"  # a symlink, FIFO, device or directory under the name
    # A reader that requires the fleet's MAC (block_mac.py):
    UNSIGNED = "unsigned"  # no tag: written without the secret
    UNKNOWN_KEY = "unknown_key"  # a tag by a key this reader does not hold
    FORGED = "forged"  # a tag that does not match: forged, or changed since


# A file's identity: its inode and the time it last changed. A store's
# rename brings a new inode; an inode number reused after an unlink comes
# with a new change time.
FileId = tuple[int, int]


def file_id(st: os.stat_result) -> FileId:
    return (st.st_ino, st.st_ctime_ns)


class BadBlock(Exception):
    """A block file that must not be served; the caller recomputes the block."""

    def __init__(self, reason: BadReason, path: Path | str, detail: str):
        super().__init__(f"{path}: {reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        # The (inode, ctime) of the file found bad, when it was opened; None
        # when it could not be (missing, or a planted name refused at open).
        self.seen: FileId | None = None


def file_bytes(payload_bytes: int) -> int:
    """Size on disk of a block file holding ``payload_bytes``."""
    return HEADER_BYTES + payload_bytes


def block_path(namespace_dir: Path, key: bytes) -> Path:
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(
            f"offload key of {len(key)} bytes cannot name a block file: keys must be "
            f"1..{MAX_KEY_BYTES} bytes. Use a prefix-caching hash of 32 bytes or less "
            f"(--prefix-caching-hash-algo sha256)."
        )
    name = key.hex()
    return namespace_dir / name[:2] / (name + BLOCK_SUFFIX)


def key_from_name(name: str) -> bytes | None:
    """The key a block file name encodes, or None if it is not a block file."""
    if not name.endswith(BLOCK_SUFFIX):
        return None
    try:
        key = bytes.fromhex(name[: -len(BLOCK_SUFFIX)])
    except ValueError:
        return None
    # Only names block_path makes: another (a long or upper-case hex name
    # someone put there) would map back to a different path, or none, and
    # evicting it would raise on the scheduler thread.
    if not 0 < len(key) <= MAX_KEY_BYTES or key.hex() + BLOCK_SUFFIX != name:
        return None
    return key


def is_temp_name(name: str) -> bool:
    """A temp file: a write in flight, or one a crashed writer left behind."""
    return name.endswith(TEMP_SUFFIX)


def temp_name(final_name: str) -> str:
    """``<final>.<writer pid>-<random>.tmp``: the pid tells a start-up scan
    whether the write may still be in flight (writer_pid)."""
    return f"{final_name}.{os.getpid()}-{os.urandom(6).hex()}{TEMP_SUFFIX}"


def writer_pid(name: str) -> int | None:
    """The pid in a temp name that temp_name made, else None."""
    middle = name[: -len(TEMP_SUFFIX)].rsplit(".", 1)[-1]
    pid, sep, _ = middle.partition("-")
    # Linux pids stay below 2**22; a longer number is not a pid we wrote.
    if not sep or not pid.isdigit() or len(pid) > 7:
        return None
    return int(pid)


def pid_is_alive(pid: int) -> bool:
    """Whether a writer is still alive, by the pid it left behind (in a temp
    name, or a ledger row: ledger/room.py, ledger/startup.py): whether a
    process ``pid`` exists on this host (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    except (OverflowError, ValueError):
        return False  # not a pid at all
    return True


def checksum(payload: memoryview) -> int:
    """The checksum a FORMAT_VERSION header holds for ``payload``."""
    return CHECKSUMS[FORMAT_VERSION](payload)


def pack_header(key: bytes, namespace: bytes, crc: int, payload_bytes: int) -> mmap.mmap:
    """The header page of a block file; the caller closes it. ``crc`` is
    ``checksum(payload)``."""
    if len(namespace) != NAMESPACE_BYTES:
        raise ValueError(f"namespace id is {len(namespace)} bytes, expected {NAMESPACE_BYTES}")
    # An anonymous mapping is page aligned, as O_DIRECT needs, and zeroed.
    header = mmap.mmap(-1, HEADER_BYTES)
    FIXED_HEADER.pack_into(
        header, 0, MAGIC, FORMAT_VERSION, len(key), crc, payload_bytes, namespace
    )
    header[FIXED_HEADER.size : FIXED_HEADER.size + len(key)] = key
    return header


def check_header(
    header: mmap.mmap | memoryview,
    path: Path | str,
    key: bytes,
    namespace: bytes,
    payload: memoryview,
) -> None:
    """Raise BadBlock unless ``header`` is the one pack_header made for this
    key, namespace and ``payload`` (its length and checksum), in this
    format version or an older one still read. ``path`` names the block in
    the message: a file, or the network tier's key name."""
    magic, version, key_len, crc, payload_bytes, file_ns = FIXED_HEADER.unpack_from(header, 0)
    if magic != MAGIC:
        raise BadBlock(BadReason.CORRUPTED, path, f"bad magic {magic!r}")
    checksum_of = CHECKSUMS.get(version)
    if checksum_of is None:
        raise BadBlock(BadReason.FOREIGN, path, f"format version {version}")
    if file_ns != namespace:
        raise BadBlock(BadReason.FOREIGN, path, f"namespace {file_ns.hex()}")
    if header[FIXED_HEADER.size : FIXED_HEADER.size + key_len] != key:
        raise BadBlock(BadReason.FOREIGN, path, "written for another key")
    if payload_bytes != payload.nbytes:
        raise BadBlock(BadReason.CORRUPTED, path, f"payload of {payload_bytes} bytes")
    if checksum_of(payload) != crc:
        raise BadBlock(BadReason.CORRUPTED, path, "payload checksum mismatch")
