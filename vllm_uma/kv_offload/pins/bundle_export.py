"""Write a pin's blocks as a bundle (bundle.py's format): ``kv-store ROOT export``.

The administrator's process; safe while servers use the store: the block
files are only read (each through a directory handle walked without
following links, layout.py, and checked as a restore checks it), the
ledger only read. A block evicted meanwhile ends the exported prefix there.

The bundle appears under its name whole or not at all: it is written as
``OUT_DIR.partial`` (every file fsynced), then renamed. A crash leaves the
``.partial`` directory, which the next export refuses (it may be another
export's, still running) with the fix: remove it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.block_file import HEADER_BYTES, BadBlock, check_header
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.db import LedgerDB
from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.bundle import (
    BLOCKS_DIR,
    MANIFEST,
    BundleBlock,
    BundleError,
    BundlePin,
    Manifest,
    read_file,
    write_synced,
)

PARTIAL = ".partial"


@dataclass(frozen=True)
class Exported:
    manifest: Manifest
    stopped: str | None  # why the prefix ends before the pin's last block


def export_pin(root: Path, name: str, out_dir: Path, namespace: bytes | None = None) -> Exported:
    """Write the longest prefix of pin ``name``'s blocks found on disk as a
    bundle at ``out_dir``. BundleError or book.PinError, nothing left
    behind, if there is nothing to export or ``out_dir`` is taken."""
    partial = out_dir.with_name(out_dir.name + PARTIAL)
    for taken in (out_dir, partial):
        if os.path.lexists(taken):
            raise BundleError(
                f"{taken} exists: an export writes a new directory and never into or over one"
                + (
                    " (this one is a crashed export's, or another export's still running: "
                    "remove it once none runs)."
                    if taken == partial
                    else ". Choose another OUT_DIR or remove it."
                )
            )
    ledger = admin.open_ledger(root)
    if ledger is None:
        raise book.PinNotFound(f"no pin named {name!r}: this store has no ledger, so no pins.")
    try:
        pin, keys = _the_pin(ledger, name, namespace)
    finally:
        ledger.close()
    info = admin.read_info(root / ".noindex" / pin.namespace.hex())
    if info is None:
        raise BundleError(
            f"the namespace {pin.namespace.hex()} of pin {name!r} has no readable namespace.json, "
            f"which an import needs to tell which model the blocks are for: start a server of "
            f"that model on {root} once (it writes the file), then export again."
        )
    ttl_s = None if pin.expires is None else round(max(1.0, pin.expires - time.time()), 1)
    try:
        os.mkdir(partial, 0o700)
    except OSError as exc:  # no parent directory; or another export made it just now
        raise BundleError(f"{partial} cannot be made: {exc.strerror or exc}") from None
    try:
        blocks, stopped = _copy_prefix(root, pin, keys, partial / BLOCKS_DIR)
        if not blocks:
            raise BundleError(
                f"pin {name!r} has none of its first block on disk ({stopped}): nothing to "
                f"carry. Warm it again (POST /v1/uma/pins with its prompt), then export."
            )
        manifest = Manifest(
            pin.namespace,
            info,
            BundlePin(pin.name, pin.tokens, ttl_s, tuple(keys)),
            pin.block_bytes,
            tuple(blocks),
        )
        _write_synced(partial / MANIFEST, json.dumps(manifest.as_json(), indent=1).encode())
        _sync_dir(partial)
        os.rename(partial, out_dir)
        _sync_dir(out_dir.parent)
    except OSError as exc:  # a full disk, a quota
        shutil.rmtree(partial, ignore_errors=True)
        raise BundleError(
            f"the bundle could not be written ({exc.strerror or exc}); nothing was left behind"
        ) from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Exported(manifest, stopped)


def _the_pin(ledger: LedgerDB, name: str, namespace: bytes | None) -> tuple[book.Pin, list]:
    """The live pin of that name and its keys, found as book.unpin finds
    it (and refused in its words)."""
    found = [p for p in book.pins(ledger, namespace) if p.name == name]
    if not found:
        where = "" if namespace is None else f" in namespace {namespace.hex()}"
        raise book.PinNotFound(f"no pin named {name!r}{where}: `kv-store ROOT pins` lists them.")
    if len(found) > 1:
        spaces = ", ".join(p.namespace.hex() for p in found)
        raise book.PinError(
            f"pins named {name!r} exist in {len(found)} namespaces ({spaces}): say which "
            f"with --namespace HEX."
        )
    pin = found[0]
    keys = book.pinned_keys(ledger, pin.namespace, name)
    if not keys:  # expired between the two reads
        raise book.PinNotFound(f"no pin named {name!r}: it expired just now.")
    return pin, keys


def _copy_prefix(
    root: Path, pin: book.Pin, keys: list[bytes], blocks_dir: Path
) -> tuple[list[BundleBlock], str | None]:
    """Copy the pin's blocks in prefix order until one is missing or bad;
    what was copied, and why it stopped (None: every block)."""
    os.mkdir(blocks_dir, 0o700)
    layout = Layout(root)
    layout.open()
    copied: list[BundleBlock] = []
    try:
        for i, key in enumerate(keys):
            ref = BlockRef(pin.namespace, key)
            try:
                data = _read_stored(layout, ref, pin.block_bytes)
            except BundleError as exc:
                return copied, f"block {i} of {len(keys)}: {exc}"
            block = BundleBlock(key, len(data), hashlib.sha256(data).hexdigest())
            _write_synced(blocks_dir / block.file_name, data)
            copied.append(block)
    finally:
        layout.close()
    _sync_dir(blocks_dir)
    return copied, None


def _read_stored(layout: Layout, ref: BlockRef, size: int) -> bytes:
    """A block file of the store, as stored, checked as a restore checks it."""
    path = layout.path(ref)
    try:
        with layout.block_dir(ref, create=False) as dir_fd:
            data = read_file(path, size, size=size, what="block file", dir_fd=dir_fd)
    except OSError as exc:  # its 2-hex directory is missing, or not ours to follow
        raise BundleError(f"block file {path} cannot be reached: {exc.strerror or exc}") from None
    view = memoryview(data)
    try:
        check_header(view[:HEADER_BYTES], path, ref.key, ref.namespace, view[HEADER_BYTES:])
    except BadBlock as bad:
        raise BundleError(f"block file {bad}") from None
    return data


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        write_synced(fd, data)
    finally:
        os.close(fd)


def _sync_dir(path: Path) -> None:
    """Make the names in ``path`` durable (its new entries, a rename)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse a directory's fsync
            os.fsync(fd)
    finally:
        os.close(fd)
