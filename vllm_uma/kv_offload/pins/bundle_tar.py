"""A bundle directory (bundle.py) as one tar stream, for the HTTP API (http_bundles.py).

API server process. Sending, the tar is made of a bundle that
bundle_export.py wrote: headers from the standard library's TarInfo, the
files' bytes as they are, so ``tar xf`` gives back the directory::

    [header manifest.json][its bytes, zero-padded to 512] <- always first
    [header blocks/<key>.kvb][its bytes, padded]           <- manifest order
    ...
    [two zero blocks][zeros to a 10240-byte record]       <- end of archive

Receiving, nothing of a tar is trusted. The first file must be
manifest.json (at most bundle.MAX_MANIFEST_BYTES), checked as an import
checks it; from then on every member must be a regular file
``blocks/<key>.kvb`` of a block the manifest lists, each at most once and
of exactly the size it lists, so the total is bounded by the manifest
(and the caller bounds the manifest by the store's budget and free space
before a block is read). Links, devices, absolute or ``..`` names, other
names, GNU long names and sparse files are refused; a pax header may only
carry a name (bounded), as Python's and GNU tar write it for long names.
Allowed and ignored: directory entries of ``.`` and ``blocks``, which
``tar cf B.tar manifest.json blocks`` writes. Nothing is extracted by
name: each file is written under the name the manifest gives it.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vllm_uma.kv_offload.pins.bundle import (
    BLOCKS_DIR,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    BundleError,
    Manifest,
)
from vllm_uma.log import human_size

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240: tar's own end padding
MAX_PAX = 64 << 10  # a pax header naming one block file is under 400 bytes
MAX_TRAILING = 1 << 20  # zeros after the end of archive (tar pads to records)
PIECE = 1 << 20  # bytes held at once of a member being written
_IGNORED_DIRS = frozenset({"", ".", BLOCKS_DIR})


class TarRefused(Exception):
    """A body that is not a bundle's tar; ``status`` 400, or 413 if too large."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# -- sending ----------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    name: str  # in the tar
    path: Path  # on disk
    size: int

    def header(self, mtime: float) -> bytes:
        info = tarfile.TarInfo(self.name)
        info.size, info.mode, info.mtime = self.size, 0o600, int(mtime)
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def members(bundle: Path, manifest: Manifest) -> list[Member]:
    """The bundle's files in tar order: the manifest first (blocking: a stat)."""
    first = Member(MANIFEST, bundle / MANIFEST, os.lstat(bundle / MANIFEST).st_size)
    return [first] + [
        Member(f"{BLOCKS_DIR}/{b.file_name}", bundle / BLOCKS_DIR / b.file_name, b.size)
        for b in manifest.blocks
    ]


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


def tar_length(files: list[Member], mtime: float) -> int:
    body = sum(len(m.header(mtime)) + m.size + len(padding(m.size)) for m in files)
    return body + len(end_of_archive(body))


def end_of_archive(length: int) -> bytes:
    """Two zero blocks, then zeros to a whole record (as tarfile writes)."""
    length += 2 * BLOCK
    return bytes(2 * BLOCK + (-length % RECORD))


# -- receiving --------------------------------------------------------------


class Source(Protocol):
    """The body, read as the tar needs it."""

    async def exact(self, n: int) -> bytes | None:
        """``n`` bytes; None at the body's end (TarRefused if it ends sooner)."""

    async def read(self, n: int) -> bytes:
        """What is there, 1 to ``n`` bytes; ``b""`` at the body's end."""


Run = Callable[..., Awaitable]  # runs a blocking call off the event loop


async def unpack(
    source: Source, out: Path, run: Run, admit: Callable[[Manifest], Awaitable[None]]
) -> Manifest:
    """Write the tar's bundle into the new directory ``out``; ``admit`` may
    refuse the manifest (raising) before any block is read."""
    await run(_mkdirs, out)
    files = _Files(source)
    first = await files.next()
    if first is None:
        raise TarRefused(400, f"the tar holds no {MANIFEST}: not a bundle's")
    manifest = await _manifest(source, *first, out, run)
    await admit(manifest)
    wanted = {f"{BLOCKS_DIR}/{b.file_name}": b for b in manifest.blocks}
    files.limit = 2 * (len(wanted) + 1) + 8  # a pax header each, and a few directories
    while (member := await files.next()) is not None:
        info, name = member
        block = wanted.pop(name, None)
        if block is None:
            raise TarRefused(
                400, f"member {name!r} is not a block file the manifest lists (or it came twice)"
            )
        if info.size != block.size:
            raise TarRefused(
                413 if info.size > block.size else 400,
                f"{name!r} is {info.size} bytes; the manifest says {block.size}",
            )
        await _write(source, info.size, out / BLOCKS_DIR / block.file_name, run)
    if wanted:
        raise TarRefused(
            400, f"the tar lacks {len(wanted)} of the manifest's block files (it was cut short?)"
        )
    await _trailing(source)
    return manifest


class _Files:
    """The tar's regular files, one at a time, their pax names applied and
    the ignored directories skipped; at most ``limit`` headers in all."""

    def __init__(self, source: Source):
        self.source, self.headers, self.limit = source, 0, 8

    async def next(self) -> tuple[tarfile.TarInfo, str] | None:
        """The next file's header and name, its bytes next in the source;
        None at the end of the archive."""
        pax: dict[str, str] | None = None
        while True:
            header = await self.source.exact(BLOCK)
            if header is None or header == bytes(BLOCK):
                return None
            self.headers += 1
            if self.headers > self.limit:
                raise TarRefused(413, f"the tar has over {self.limit} members: not a bundle's")
            info = _parse(header)
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
                records = _pax(await _body(self.source, info.size, MAX_PAX, "a pax header"))
                pax = records if info.type == tarfile.XHDTYPE else pax
                continue
            name = _name(info, pax)
            if pax and pax.get("size", str(info.size)) != str(info.size):
                raise TarRefused(400, f"{name!r}: its pax size differs from its header's")
            pax = None
            if info.type == tarfile.DIRTYPE and name.rstrip("/") in _IGNORED_DIRS:
                continue
            if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or info.issparse():
                raise TarRefused(
                    400, f"member {name!r} is {_kind(info)}: a bundle holds files only"
                )
            return info, name


def _parse(header: bytes) -> tarfile.TarInfo:
    try:
        return tarfile.TarInfo.frombuf(header, "utf-8", "strict")
    except (tarfile.HeaderError, UnicodeDecodeError) as exc:
        raise TarRefused(400, f"the body is not a tar (a bad header: {exc})") from None


def _name(info: tarfile.TarInfo, pax: dict | None) -> str:
    """The member's name, less a leading ``./``; an absolute one refused."""
    name = (pax or {}).get("path", info.name)
    if name.startswith("/"):
        raise TarRefused(400, f"member {name!r} has an absolute name: a bundle's are relative")
    return name[2:] if name.startswith("./") else name


def _kind(info: tarfile.TarInfo) -> str:
    if info.issym() or info.islnk():
        return "a link"
    if info.isdir():
        return "a directory"
    return "a sparse file" if info.issparse() else f"of tar type {info.type!r}"


def _pax(data: bytes) -> dict[str, str]:
    """A pax header's records (``"<len> <key>=<value>\\n"``, len counting all)."""
    records, at = {}, 0
    try:
        while at < len(data) and data[at] != 0:
            length = int(data[at : data.index(b" ", at)])
            record = data[at : at + length]
            if length <= 0 or len(record) != length or not record.endswith(b"\n"):
                raise ValueError("a record's length is wrong")
            key, _, value = record[record.index(b" ") + 1 : -1].partition(b"=")
            records[key.decode()] = value.decode()
            at += length
    except ValueError as exc:
        raise TarRefused(400, f"a pax header cannot be read ({exc})") from None
    if any(k.startswith("GNU.sparse") for k in records):
        raise TarRefused(400, "a sparse file: a bundle holds plain files only")
    return records


async def _body(source: Source, size: int, limit: int, what: str) -> bytes:
    if size > limit:
        raise TarRefused(413, f"{what} of {size} bytes is over the {human_size(limit)} allowed")
    data = await source.exact(size + len(padding(size)))
    if data is None:
        raise TarRefused(400, f"the body ends inside {what}")
    return data[:size]


async def _manifest(source: Source, info, name: str, out: Path, run: Run) -> Manifest:
    if name != MANIFEST:
        raise TarRefused(
            400,
            f"the tar's first file is {name!r}, not {MANIFEST}: make it with "
            f"`tar -C BUNDLE -cf B.tar {MANIFEST} {BLOCKS_DIR}` (the manifest first).",
        )
    data = await _body(source, info.size, MAX_MANIFEST_BYTES, MANIFEST)
    try:
        manifest = Manifest.from_json(json.loads(data))
    except BundleError as exc:
        raise TarRefused(400, f"{MANIFEST}: {exc}") from None
    except ValueError as exc:
        raise TarRefused(400, f"{MANIFEST} is not JSON ({exc})") from None
    await run(_write_piece, out / MANIFEST, data, True)
    return manifest


async def _write(source: Source, size: int, path: Path, run: Run) -> None:
    """``size`` bytes of the body into ``path``, a piece at a time."""
    left, first = size, True
    while left or first:
        piece = bytearray()
        while left and len(piece) < PIECE:
            got = await source.read(min(left, PIECE - len(piece)))
            if not got:
                raise TarRefused(400, f"the body ends inside {path.name}")
            piece += got
            left -= len(got)
        await run(_write_piece, path, bytes(piece), first)
        first = False
    if await source.exact(len(padding(size))) is None:
        raise TarRefused(400, f"the body ends inside {path.name}")


async def _trailing(source: Source) -> None:
    """After the end of archive: zeros only (record padding), bounded."""
    seen = 0
    while chunk := await source.read(PIECE):
        seen += len(chunk)
        if chunk.count(0) != len(chunk):
            raise TarRefused(400, "the body goes on after the tar's end of archive")
        if seen > MAX_TRAILING:
            raise TarRefused(413, f"over {human_size(MAX_TRAILING)} of padding after the tar")


def _mkdirs(out: Path) -> None:
    os.mkdir(out, 0o700)
    os.mkdir(out / BLOCKS_DIR, 0o700)


def _write_piece(path: Path, data: bytes, first: bool) -> None:
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= (os.O_CREAT | os.O_EXCL) if first else os.O_APPEND
    fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
