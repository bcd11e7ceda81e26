"""L3: read one block file back, checked, or say why it cannot be served.

Runs on the disk tier's I/O threads (engine-core process), and in
``vllm-uma kv-store verify`` (the administrator's process); nothing here
touches vLLM. The format is block_file.py's.

Nothing under the name is trusted to be a block file: every open is
``O_NOFOLLOW | O_NONBLOCK`` relative to a directory handle the caller walked
to without following symlinks (layout.py), and ``fstat`` must show a regular
file before a byte is read. A symlink, FIFO, socket or device planted under
a block's name is a bad block (NOT_A_FILE), never a path to elsewhere and
never a read that blocks an I/O thread (a FIFO's open would wait for a
writer without O_NONBLOCK).
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path

from vllm_uma.kv_offload import block_mac
from vllm_uma.kv_offload.disk.block_file import (
    FIXED_HEADER,
    HEADER_BYTES,
    MAGIC,
    PROCESS_ERRNOS,
    SAFE_OPEN,
    BadBlock,
    BadReason,
    check_header,
    file_id,
)
from vllm_uma.kv_offload.disk.block_write import O_DIRECT
from vllm_uma.kv_offload.mac_keys import KeyRing


def read_block(
    path: Path,
    key: bytes,
    namespace: bytes,
    dest: memoryview,
    *,
    direct: bool,
    dir_fd: int | None = None,
    keys: KeyRing | None = None,
) -> None:
    """Fill ``dest`` with the payload of block file ``path``, or raise BadBlock.
    With ``keys``, a file without a valid MAC by one of them is bad too.

    Every field is checked against what the caller expects (key, namespace,
    payload length) and the payload against its checksum: ``dest`` is either
    the block, or the call raises and ``dest`` must be treated as garbage.
    With ``dir_fd`` only ``path.name`` is resolved, relative to it. A
    BadBlock raised once the file is open names it (``seen``), so that only
    that file is deleted, never a fresh copy stored under the name since."""
    expected = HEADER_BYTES + dest.nbytes
    header = mmap.mmap(-1, HEADER_BYTES)
    seen = None
    try:
        fd = _open_for_read(path, direct, dir_fd)
        try:
            st = os.fstat(fd)
            seen = file_id(st)
            _check_file(st, path, expected)
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
        check_header(header, path, key, namespace, dest)
        if keys is not None:
            block_mac.verify(header, dest, keys, str(path))
    except BadBlock as bad:
        bad.seen = seen
        raise
    finally:
        header.close()


def _check_file(st: os.stat_result, path: Path, expected: int) -> None:
    """``st`` is a regular file of ``expected`` bytes, or BadBlock."""
    if not stat.S_ISREG(st.st_mode):
        kind = _file_kind(st.st_mode)
        raise BadBlock(BadReason.NOT_A_FILE, path, f"a {kind}, not a block file")
    size = st.st_size
    if size < expected:
        raise BadBlock(BadReason.TRUNCATED, path, f"{size} bytes, expected {expected}")
    if size > expected:
        raise BadBlock(BadReason.CORRUPTED, path, f"{size} bytes, expected {expected}")


# The largest payload a header may claim before a reader that does not know
# the block size sizes a buffer from it: a 128-token block of a 405B-class
# model (126 layers, 8 KV heads of 128, bf16) is about 130 MB. Without it, a
# sparse file as large as its header's claim would pass the size check and
# have the reader allocate (and read) all of it.
MAX_PAYLOAD_BYTES = 1 << 30


def declared_payload_bytes(path: Path, *, dir_fd: int | None = None) -> int:
    """The payload length a block file's header claims (for a reader that
    does not know the block size, e.g. ``vllm-uma kv-store verify``), checked
    against MAX_PAYLOAD_BYTES and the file's size, so that a corrupted length
    never sizes a buffer. Raises BadBlock for anything that is not a block
    file with a whole header."""
    fd = _open_for_read(path, False, dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadBlock(BadReason.NOT_A_FILE, path, "not a regular file")
        fixed = os.pread(fd, FIXED_HEADER.size, 0)
    except OSError as exc:
        raise BadBlock(BadReason.UNREADABLE, path, f"read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(fixed) < FIXED_HEADER.size:
        raise BadBlock(BadReason.TRUNCATED, path, f"{len(fixed)} bytes, no whole header")
    magic, _, _, _, payload_bytes, _ = FIXED_HEADER.unpack(fixed)
    if magic != MAGIC:
        raise BadBlock(BadReason.CORRUPTED, path, f"bad magic {magic!r}")
    if payload_bytes > MAX_PAYLOAD_BYTES:
        raise BadBlock(
            BadReason.CORRUPTED,
            path,
            f"the header claims {payload_bytes} bytes of payload, over the "
            f"{MAX_PAYLOAD_BYTES} of the largest block vllm-uma writes",
        )
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
