"""L3 block files (vllm_uma/kv_offload/disk/: block_file.py, block_write.py,
block_read.py): format, atomic writes, and every way a file can be
unfit to serve."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import stat
import struct
import sys
import threading
import time
import zlib

import crc32c
import pytest

from vllm_uma.kv_offload.disk import block_file as bf
from vllm_uma.kv_offload.disk import block_write as direct_io
from vllm_uma.kv_offload.disk.block_file import BadBlock, BadReason
from vllm_uma.kv_offload.disk.block_read import read_block
from vllm_uma.kv_offload.disk.block_write import write_block

NS = bytes(range(16))
OTHER_NS = bytes(16)
KEY = bytes.fromhex("ab" * 32) + (0).to_bytes(4, "big")
OTHER_KEY = bytes.fromhex("cd" * 32) + (0).to_bytes(4, "big")
ROW = 8192


def payload(seed: int = 7) -> memoryview:
    region = mmap.mmap(-1, ROW)  # page aligned: usable with O_DIRECT
    region[:] = bytes((seed + i * 31) % 251 for i in range(ROW))
    return memoryview(region)


def written(tmp_path, key=KEY, ns=NS, data=None, direct=False):
    data = payload() if data is None else data
    path = bf.block_path(tmp_path, key)
    write_block(path, key, ns, data, direct=direct)
    return path, data


def read(path, key=KEY, ns=NS, direct=False) -> bytes:
    dest = memoryview(mmap.mmap(-1, ROW))
    read_block(path, key, ns, dest, direct=direct)
    return bytes(dest)


def bad_reason(path, **kw) -> BadReason:
    with pytest.raises(BadBlock) as info:
        read(path, **kw)
    return info.value.reason


@pytest.mark.parametrize("direct", [False, True])
def test_round_trip(tmp_path, direct):
    if direct and not direct_io.probe_direct(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    path, data = written(tmp_path, direct=direct)
    assert read(path, direct=direct) == bytes(data)


def test_layout_header_page_then_payload(tmp_path):
    path, data = written(tmp_path)
    assert path == tmp_path / KEY.hex()[:2] / f"{KEY.hex()}.kvb"
    raw = path.read_bytes()
    assert len(raw) == bf.file_bytes(ROW) == 4096 + ROW
    magic, version, key_len, crc, size, ns = struct.unpack_from("<8sHHIQ16s", raw)
    assert (magic, version, key_len, size, ns) == (bf.MAGIC, 2, len(KEY), ROW, NS)
    # Version 2's checksum is CRC-32C (Castagnoli), not zlib's CRC-32.
    assert crc == crc32c.crc32c(data) != zlib.crc32(data)
    assert raw[40 : 40 + len(KEY)] == KEY
    assert raw[40 + len(KEY) : 4096] == bytes(4096 - 40 - len(KEY))
    assert raw[4096:] == bytes(data)


def test_written_file_is_private_and_no_temp_file_stays(tmp_path):
    path, _ = written(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == [path.name]


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def full(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    with pytest.raises(OSError) as info:
        written(tmp_path)
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(bf.block_path(tmp_path, KEY).parent) == []


def test_a_short_write_fails_the_block_but_is_not_a_full_disk(tmp_path, monkeypatch):
    # Only ENOSPC/EDQUOT from the kernel turn disk stores off.
    monkeypatch.setattr(os, "pwritev", lambda fd, buffers, offset: 100)
    with pytest.raises(OSError) as info:
        written(tmp_path)
    assert info.value.errno == errno.EIO
    assert os.listdir(bf.block_path(tmp_path, KEY).parent) == []


def test_missing(tmp_path):
    assert bad_reason(bf.block_path(tmp_path, KEY)) is BadReason.MISSING


def test_truncated(tmp_path):
    path, _ = written(tmp_path)
    os.truncate(path, 4096 + ROW - 1)
    assert bad_reason(path) is BadReason.TRUNCATED
    os.truncate(path, 0)  # what a crash after the rename can leave
    assert bad_reason(path) is BadReason.TRUNCATED


def test_longer_than_the_header_says(tmp_path):
    path, _ = written(tmp_path)
    with open(path, "ab") as f:
        f.write(b"x")
    assert bad_reason(path) is BadReason.CORRUPTED


def flip_payload_byte(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(4096 + offset)
        byte = f.read(1)
        f.seek(4096 + offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_flipped_payload_byte(tmp_path):
    path, _ = written(tmp_path)
    flip_payload_byte(path, 1234)
    assert bad_reason(path) is BadReason.CORRUPTED


def test_the_checksum_is_crc32c_castagnoli():
    # RFC 3720's check value: a zlib crc32 (0xCBF43926) is another checksum.
    assert bf.checksum(memoryview(b"123456789")) == 0xE3069283


def test_the_checksum_lets_other_threads_run():
    # The I/O threads checksum blocks on every core at once only if the
    # checksum releases the GIL. With a switch interval of an hour, no thread
    # is made to give the GIL up: the main thread, once its sleep is over,
    # runs again only when the checksumming thread releases it, in a call (a
    # checksum that holds the GIL lets it in after the last of them).
    block = memoryview(mmap.mmap(-1, 2_949_120))  # the default model's block
    calls = 200
    done: list[int] = []

    def checksum_blocks() -> None:
        for i in range(calls):
            done.append(i)
            bf.checksum(block)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(3600)
    try:
        thread = threading.Thread(target=checksum_blocks)
        thread.start()
        time.sleep(0.001)  # the thread takes the GIL and starts its calls
        calls_begun = len(done)
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert calls_begun < calls


def as_version_1(path, data) -> None:
    """Rewrite a version 2 file's header as a version 1 writer made it: the
    same fields, version 1 and zlib's crc32 of the payload."""
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<H", 1))
        f.seek(12)
        f.write(struct.pack("<I", zlib.crc32(data)))


def test_a_version_1_file_is_still_read_with_its_zlib_crc32(tmp_path):
    path, data = written(tmp_path)
    as_version_1(path, data)
    assert read(path) == bytes(data)


def test_a_version_1_file_with_a_flipped_byte_is_refused(tmp_path):
    path, data = written(tmp_path)
    as_version_1(path, data)
    flip_payload_byte(path, 777)
    assert bad_reason(path) is BadReason.CORRUPTED


def test_a_version_1_header_over_a_crc32c_is_refused(tmp_path):
    # Each version's checksum is checked with its own function: a file whose
    # version says 1 but holds version 2's checksum does not pass.
    path, _ = written(tmp_path)
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<H", 1))
    assert bad_reason(path) is BadReason.CORRUPTED


def test_bad_magic(tmp_path):
    path, _ = written(tmp_path)
    with open(path, "r+b") as f:
        f.write(b"NOTAKVB!")
    assert bad_reason(path) is BadReason.CORRUPTED


@pytest.mark.parametrize("version", [0, 3, 99])
def test_other_format_version(tmp_path, version):
    path, _ = written(tmp_path)
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<H", version))
    assert bad_reason(path) is BadReason.FOREIGN


def test_copied_from_another_namespace(tmp_path):
    (tmp_path / "other").mkdir()
    theirs, _ = written(tmp_path / "other", ns=OTHER_NS)
    ours = bf.block_path(tmp_path, KEY)
    ours.parent.mkdir()
    shutil.copy(theirs, ours)
    assert bad_reason(ours) is BadReason.FOREIGN


def test_renamed_to_another_key(tmp_path):
    path, _ = written(tmp_path)
    other = bf.block_path(tmp_path, OTHER_KEY)
    other.parent.mkdir()
    os.rename(path, other)
    assert bad_reason(other, key=OTHER_KEY) is BadReason.FOREIGN


def test_unreadable(tmp_path, monkeypatch):
    path, _ = written(tmp_path)

    def io_error(fd, buffers, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", io_error)
    assert bad_reason(path) is BadReason.UNREADABLE


def test_names_and_leftovers():
    assert bf.key_from_name(f"{KEY.hex()}.kvb") == KEY
    assert bf.key_from_name("namespace.json") is None
    assert bf.key_from_name("zz.kvb") is None
    # Names block_path never makes: evicting them would raise.
    assert bf.key_from_name(f"{(b'k' * (bf.MAX_KEY_BYTES + 1)).hex()}.kvb") is None
    assert bf.key_from_name(f"{KEY.hex().upper()}.kvb") is None
    assert bf.key_from_name(".kvb") is None
    assert bf.is_temp_name(f"{KEY.hex()}.kvb.0123456789ab.tmp")
    assert not bf.is_temp_name(f"{KEY.hex()}.kvb")


def test_a_key_too_long_for_a_file_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sha256"):
        bf.block_path(tmp_path, bytes(121))


def test_direct_io_needs_page_aligned_writable_buffers():
    assert direct_io.is_direct_capable(payload())
    assert not direct_io.is_direct_capable(memoryview(bytearray(ROW))[1:4097])
    assert not direct_io.is_direct_capable(memoryview(bytes(ROW)))  # read-only
    assert not direct_io.is_direct_capable(payload()[:100])


@pytest.mark.parametrize("direct", [False, True])
def test_a_fifo_under_the_name_is_not_a_file_and_never_blocks(tmp_path, direct):
    path = bf.block_path(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    dest = memoryview(mmap.mmap(-1, 4096))
    with pytest.raises(BadBlock) as info:
        read_block(path, KEY, NS, dest, direct=direct and bool(direct_io.O_DIRECT))
    assert info.value.reason is BadReason.NOT_A_FILE
