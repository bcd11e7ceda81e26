"""L3 on-disk format: one file per KV block, and the file operations on it.

Runs on the disk tier's I/O threads (engine-core process); nothing here
touches vLLM. A block file holds exactly one primary-tier (L2) row and is
named by the block's ``OffloadKey`` (prefix block hash + 4-byte group index),
so the same prompt prefix maps to the same file in every process:

    <namespace_dir>/<first 2 hex of key>/<key hex>.kvb

    offset  size  field
    0       8     magic  b"UMAKVB\\r\\n" (a text-mode copy mangles \\r\\n)
    8       2     format version (little-endian u16)
    10      2     key length K (u16)
    12      4     crc32 of the payload (u32)
    16      8     payload length P (u64)
    24      16    namespace id (model, dtype, layout: see the spec)
    40      K     key bytes
    40+K    ...   zero padding
    4096    P     payload: one primary-tier row, byte for byte
    4096+P        end of file

The header is padded to a page so that the payload starts page aligned: with
page-aligned primary rows, header and payload move in one O_DIRECT preadv /
pwritev, straight between the disk and the row. Measured here on a 360 KiB
block: an O_DIRECT read costs 72 us of CPU, a buffered one 194 us (the copy
and the page-cache bookkeeping), and the crc32 check about 90 us.

Nothing under the name is trusted to be a block file: every open is
``O_NOFOLLOW | O_NONBLOCK`` relative to a directory handle the caller walked
to without following symlinks (layout.py), and ``fstat`` must show a regular
file before a byte is read. A symlink, FIFO, socket or device planted under
a block's name is a bad block (NOT_A_FILE), never a path to elsewhere and
never a read that blocks an I/O thread (a FIFO's open would wait for a
writer without O_NONBLOCK).

Writes are atomic by rename: a temp file ``<key hex>.kvb.<pid>-<random>.tmp``
in the same directory, created O_EXCL and 0600, renamed to the final name
once complete. A reader never sees half a file, and a crash leaves at most a
temp file that a later start-up deletes once its writer is gone (layout.py).
There is no fsync: after a power loss a renamed file may hold zeros or stale
bytes, and the checksum rejects it on load (the block is then recomputed),
which costs less than an fsync per block.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import stat
import struct
import zlib
from enum import Enum
from pathlib import Path

MAGIC = b"UMAKVB\r\n"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
NAMESPACE_BYTES = 16
_FIXED = struct.Struct("<8sHHIQ16s")  # magic, version, key len, crc32, payload len, ns
# A key becomes a file name of 2 hex digits per byte + ".kvb", and its temp
# file adds ".<pid>-<12 hex>.tmp" (up to 25 characters): stay under the
# 255-byte name limit of ext4, xfs and btrfs.
MAX_KEY_BYTES = 112
BLOCK_SUFFIX = ".kvb"
TEMP_SUFFIX = ".tmp"
# O_DIRECT needs buffer address, length and file offset aligned to the
# device's logical block (512 B or 4 KiB); a page covers both.
DIRECT_ALIGN = mmap.PAGESIZE
O_DIRECT = getattr(os, "O_DIRECT", 0)


class BadReason(Enum):
    """Why a block file cannot be served (also the metric label)."""

    MISSING = "missing"  # no file under the name
    TRUNCATED = "truncated"  # shorter than header + payload (torn write, full disk)
    CORRUPTED = "corrupted"  # bad magic, wrong length or checksum mismatch
    FOREIGN = "foreign"  # another namespace, key or format version
    UNREADABLE = "unreadable"  # open or read failed (EIO, EACCES, ...)
    NOT_A_FILE = "not_a_file"  # a symlink, FIFO, device or directory under the name


class BadBlock(Exception):
    """A block file that must not be served; the caller recomputes the block."""

    def __init__(self, reason: BadReason, path: Path | str, detail: str):
        super().__init__(f"{path}: {reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


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


def is_direct_capable(buffer: memoryview) -> bool:
    """Whether ``buffer`` can take part in O_DIRECT I/O (page-aligned address
    and length, writable so that its address can be taken)."""
    if not O_DIRECT or buffer.readonly or buffer.nbytes % DIRECT_ALIGN:
        return False
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    return address % DIRECT_ALIGN == 0


def probe_direct(directory: Path) -> bool:
    """Whether files in ``directory`` accept O_DIRECT (ext4/xfs do; some
    overlay, network and older tmpfs mounts refuse it with EINVAL)."""
    if not O_DIRECT:
        return False
    path = directory / temp_name(".direct-probe")
    page = mmap.mmap(-1, DIRECT_ALIGN)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | O_DIRECT, 0o600)
        try:
            os.write(fd, page)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        page.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def _header(key: bytes, namespace: bytes, crc: int, payload_bytes: int) -> mmap.mmap:
    if len(namespace) != NAMESPACE_BYTES:
        raise ValueError(f"namespace id is {len(namespace)} bytes, expected {NAMESPACE_BYTES}")
    # An anonymous mapping is page aligned, as O_DIRECT needs, and zeroed.
    header = mmap.mmap(-1, HEADER_BYTES)
    _FIXED.pack_into(header, 0, MAGIC, FORMAT_VERSION, len(key), crc, payload_bytes, namespace)
    header[_FIXED.size : _FIXED.size + len(key)] = key
    return header


# Errors of the process, not of the file (out of descriptors or memory, a
# signal): a load that meets one is a miss, and the file is kept.
PROCESS_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN})

# Never follow a symlink planted under a name; never wait on a FIFO's open.
SAFE_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_block(
    path: Path,
    key: bytes,
    namespace: bytes,
    payload: memoryview,
    *,
    direct: bool,
    dir_fd: int | None = None,
) -> None:
    """Write ``payload`` as the block file ``path``, atomically (see the module
    docstring). ``direct`` asks for O_DIRECT; it needs a direct-capable payload.
    With ``dir_fd`` (a handle on ``path``'s directory) only ``path.name`` is
    resolved, relative to it. Raises OSError (ENOSPC included) with nothing
    left under ``path``."""
    header = _header(key, namespace, zlib.crc32(payload), payload.nbytes)
    temp = path.with_name(temp_name(path.name))
    # O_DIRECT: the block goes from the primary row to the disk without a
    # page-cache copy (measured: buffered writes leave 100% of the block in
    # the page cache, and posix_fadvise(DONTNEED) cannot drop dirty pages).
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | SAFE_OPEN | (O_DIRECT if direct else 0)
    if dir_fd is not None:
        fd = os.open(temp.name, flags, 0o600, dir_fd=dir_fd)
    else:
        try:
            fd = os.open(temp, flags, 0o600)
        except FileNotFoundError:
            # First block of this 2-hex subdirectory (or someone removed it).
            os.makedirs(temp.parent, mode=0o700, exist_ok=True)
            fd = os.open(temp, flags, 0o600)
    try:
        try:
            written = os.pwritev(fd, [header, payload], 0)
        finally:
            os.close(fd)
        if written != HEADER_BYTES + payload.nbytes:
            # No error, yet not every byte: a signal, or a quota or device
            # limit hit mid-write. Not proof of a full disk (ENOSPC says
            # that), so it fails this block only.
            raise OSError(errno.EIO, f"short write of {written} bytes", str(temp))
        # rename replaces whatever is under the name (even a planted FIFO or
        # symlink) without following it.
        if dir_fd is not None:
            os.rename(temp.name, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            if dir_fd is not None:
                os.unlink(temp.name, dir_fd=dir_fd)
            else:
                os.unlink(temp)
        raise
    finally:
        header.close()


def read_block(
    path: Path,
    key: bytes,
    namespace: bytes,
    dest: memoryview,
    *,
    direct: bool,
    dir_fd: int | None = None,
) -> None:
    """Fill ``dest`` with the payload of block file ``path``, or raise BadBlock.

    Every field is checked against what the caller expects (key, namespace,
    payload length) and the payload against its checksum: ``dest`` is either
    the block, or the call raises and ``dest`` must be treated as garbage.
    With ``dir_fd`` only ``path.name`` is resolved, relative to it."""
    expected = HEADER_BYTES + dest.nbytes
    header = mmap.mmap(-1, HEADER_BYTES)
    try:
        fd = _open_for_read(path, direct, dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                kind = _file_kind(st.st_mode)
                raise BadBlock(BadReason.NOT_A_FILE, path, f"a {kind}, not a block file")
            size = st.st_size
            if size < expected:
                raise BadBlock(BadReason.TRUNCATED, path, f"{size} bytes, expected {expected}")
            if size > expected:
                raise BadBlock(BadReason.CORRUPTED, path, f"{size} bytes, expected {expected}")
            try:
                got = os.preadv(fd, [header, dest], 0)
            except OSError as exc:
                raise BadBlock(BadReason.UNREADABLE, path, f"read: {exc.strerror}") from None
            if not direct:
                # The bytes now live in the primary row; a second copy in the
                # page cache would take RAM from the KV tiers on a unified-
                # memory machine (measured: it drops 100% of the file).
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if got != expected:
            raise BadBlock(BadReason.TRUNCATED, path, f"read {got} bytes, expected {expected}")
        _check_header(header, path, key, namespace, dest)
    finally:
        header.close()


def declared_payload_bytes(path: Path, *, dir_fd: int | None = None) -> int:
    """The payload length a block file's header claims (for a reader that
    does not know the block size, e.g. ``vllm-uma kv-store verify``), checked
    against the file's size, so that a corrupted length never sizes a buffer.
    Raises BadBlock for anything that is not a block file with a whole header."""
    fd = _open_for_read(path, False, dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadBlock(BadReason.NOT_A_FILE, path, "not a regular file")
        fixed = os.pread(fd, _FIXED.size, 0)
    except OSError as exc:
        raise BadBlock(BadReason.UNREADABLE, path, f"read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(fixed) < _FIXED.size:
        raise BadBlock(BadReason.TRUNCATED, path, f"{len(fixed)} bytes, no whole header")
    magic, _, _, _, payload_bytes, _ = _FIXED.unpack(fixed)
    if magic != MAGIC:
        raise BadBlock(BadReason.CORRUPTED, path, f"bad magic {magic!r}")
    expected = HEADER_BYTES + payload_bytes
    if st.st_size != expected:
        reason = BadReason.TRUNCATED if st.st_size < expected else BadReason.CORRUPTED
        raise BadBlock(reason, path, f"{st.st_size} bytes, the header claims {expected}")
    return payload_bytes


def _open_for_read(path: Path, direct: bool, dir_fd: int | None) -> int:
    flags = os.O_RDONLY | SAFE_OPEN | (O_DIRECT if direct else 0)
    try:
        if dir_fd is not None:
            return os.open(path.name, flags, dir_fd=dir_fd)
        return os.open(path, flags)
    except FileNotFoundError:
        raise BadBlock(BadReason.MISSING, path, "no such file") from None
    except OSError as exc:
        if exc.errno in PROCESS_ERRNOS:
            raise  # this process is short of something; the file is not to blame
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise BadBlock(BadReason.NOT_A_FILE, path, "a symlink, not a block file") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened write-only elsewhere
            raise BadBlock(BadReason.NOT_A_FILE, path, "a socket or FIFO") from None
        if exc.errno == errno.EINVAL and direct:
            # O_DIRECT is refused by what is not a regular file (a FIFO...).
            kind = _kind_at(path, dir_fd)
            if kind is not None:
                raise BadBlock(BadReason.NOT_A_FILE, path, f"a {kind}, not a block file") from None
        raise BadBlock(BadReason.UNREADABLE, path, f"open: {exc.strerror}") from None


def _kind_at(path: Path, dir_fd: int | None) -> str | None:
    """What is under ``path`` if it is not a regular file, else None."""
    try:
        st = os.stat(
            path.name if dir_fd is not None else path, dir_fd=dir_fd, follow_symlinks=False
        )
    except OSError:
        return None
    return None if stat.S_ISREG(st.st_mode) else _file_kind(st.st_mode)


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return f"file of mode {oct(mode)}"


def _check_header(
    header: mmap.mmap, path: Path, key: bytes, namespace: bytes, payload: memoryview
) -> None:
    magic, version, key_len, crc, payload_bytes, file_ns = _FIXED.unpack_from(header, 0)
    if magic != MAGIC:
        raise BadBlock(BadReason.CORRUPTED, path, f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise BadBlock(BadReason.FOREIGN, path, f"format version {version}")
    if file_ns != namespace:
        raise BadBlock(BadReason.FOREIGN, path, f"namespace {file_ns.hex()}")
    if header[_FIXED.size : _FIXED.size + key_len] != key:
        raise BadBlock(BadReason.FOREIGN, path, "written for another key")
    if payload_bytes != payload.nbytes:
        raise BadBlock(BadReason.CORRUPTED, path, f"payload of {payload_bytes} bytes")
    if zlib.crc32(payload) != crc:
        raise BadBlock(BadReason.CORRUPTED, path, "payload checksum mismatch")
