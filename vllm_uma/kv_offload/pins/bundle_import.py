"""Write a bundle (bundle.py) into a store and pin it there: ``kv-store ROOT import``.

The administrator's process, safe while servers use the store: blocks land
the way the disk tier's I/O threads store them (io_tasks.py), so running
servers find them through their feed threads (disk/ledger/feed.py):

1. Everything is checked before anything is written: the manifest, every
   block file (size, sha256, the store's own header check), and that the
   store knows the bundle's namespace (``.noindex/<id>/namespace.json``
   is the manifest's). Blocks of a namespace no server of the store has
   would never be served: refused, with the namespaces the store has.
2. The pin is made first, its budget checked in its transaction (book.py):
   a pin over budget is refused with nothing written, and each block the
   import lands is at once held against the evictions of the next ones
   (ours and every server's). A pin may name blocks not stored yet.
3. Each block: reserved in the ledger under the cap (evicting the least
   recent unpinned blocks of any server), written as a temp file
   (``<key>.kvb.<pid>-<random>.tmp``), fsynced, renamed, committed. A block
   another writer holds or is writing is skipped: the same bytes. A crash
   leaves at most a temp file and a reservation of a dead process, which
   a server's start-up and room-making reclaim as any crashed store's;
   never a half block under a block's name, never a ledger row that is
   present without its whole file.

The cap is a server's setting (the fs tier's ``max_size_gib``), not
recorded in the store: the import takes ``--max-size-gib`` as the servers
have it, and without it the rule a server without it follows (10% of the
volume), so that it evicts as those servers would.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.block_file import SAFE_OPEN, temp_name
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.disk.settings import (
    DEFAULT_CAP_FRACTION,
    DiskTierSettingsError,
    given_cap,
    pin_share,
)
from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.bundle import (
    BundleError,
    Manifest,
    check_bundle,
    read_block,
    write_synced,
)
from vllm_uma.log import human_size


@dataclass(frozen=True)
class StoreLimits:
    """What the import obeys, as the store's servers would."""

    cap_bytes: int | None  # None: no cap
    cap_reason: str
    pin_share: float

    @classmethod
    def of(cls, root: Path, max_size_gib: float | None, share: float | None) -> StoreLimits:
        admin.store_dir(root)  # a store, or StoreError
        try:
            if max_size_gib is None:
                vfs = os.statvfs(root)
                cap = int(vfs.f_blocks * vfs.f_frsize * DEFAULT_CAP_FRACTION)
                cap_bytes, reason = cap, "10% of the volume, as a server without max_size_gib"
            else:
                cap_bytes, reason = given_cap(max_size_gib)
            return cls(cap_bytes, reason, pin_share(share))
        except DiskTierSettingsError as exc:
            raise BundleError(f"{exc} (here: --max-size-gib or --pin-share)") from None


@dataclass(frozen=True)
class Imported:
    manifest: Manifest
    written: int
    already: int  # another writer held or was writing them
    pin: book.Pin


def import_bundle(
    root: Path, bundle: Path, limits: StoreLimits, ttl_s: float | None = None
) -> Imported:
    """Check ``bundle``, pin it in the store at ``root`` and write its
    blocks; ``ttl_s`` None: what was left of the pin at the export.
    BundleError, book.PinError or admin.StoreError say why not."""
    manifest = check_bundle(bundle)
    check_namespace(root, manifest)
    size = manifest.block_bytes
    if limits.cap_bytes is not None and size > limits.cap_bytes:
        raise BundleError(
            f"a block of this bundle is {human_size(size)}, over the store's cap of "
            f"{human_size(limits.cap_bytes)} ({limits.cap_reason}): raise --max-size-gib."
        )
    ledger = admin.open_ledger(root)
    if ledger is None:
        raise BundleError(
            f"{root} has no ledger yet: start a server on it once (with the fs tier), "
            f"then import again."
        )
    try:
        pin = _pin(ledger, manifest, limits, ttl_s)
        written, already = _write_blocks(root, bundle, manifest, ledger, limits)
        pin = next(p for p in book.pins(ledger, manifest.namespace) if p.name == pin.name)
    finally:
        ledger.close()
    return Imported(manifest, written, already, pin)


def check_namespace(root: Path, manifest: Manifest) -> None:
    """The store knows the bundle's namespace, as the bundle describes it."""
    noindex = admin.store_dir(root)
    ns = manifest.namespace.hex()
    info = admin.read_info(noindex / ns)
    if info == manifest.namespace_info:
        return
    if info is not None:
        raise BundleError(
            f"the store's namespace {ns} is not described as the bundle's (its namespace.json "
            f"differs: model {info.get('model')!r} here, {manifest.model!r} in the bundle); "
            f"refused, nothing written. Start a server of the bundle's model on {root} once "
            f"(it rewrites the file), then import again."
        )
    known = [
        f"{n} ({(admin.read_info(d) or {}).get('model', '?')})" for n, d in admin.namespaces(root)
    ]
    raise BundleError(
        f"bundle of model {manifest.model!r} (namespace {ns}) refused, nothing written: the "
        f"store {root} does not know that namespace, so no server of it would serve these "
        f"blocks (it has {', '.join(known) if known else 'no namespace'}). Start a server of "
        f"{manifest.model!r} with the same KV settings on this store once, then import again; "
        f"or import into a store of that model."
    )


def _pin(ledger: Ledger, manifest: Manifest, limits: StoreLimits, ttl_s: float | None):
    bundled = manifest.pin
    try:
        return book.pin(
            ledger, manifest.namespace, bundled.name, list(bundled.keys),
            block_bytes=manifest.block_bytes, tokens=bundled.tokens,
            ttl_s=bundled.ttl_s if ttl_s is None else ttl_s,
            budget=book.PinBudget(limits.pin_share, limits.cap_bytes),
        )  # fmt: skip
    except book.PinError as exc:  # its kind kept: the HTTP API answers 409 for a budget's
        raise type(exc)(f"{exc} Nothing was written.") from None


def _write_blocks(
    root: Path, bundle: Path, manifest: Manifest, ledger: Ledger, limits: StoreLimits
) -> tuple[int, int]:
    """Each block reserved, written and committed as the disk tier stores
    one; (written, already there)."""
    writer = f"kv-store-import-{os.getpid()}-{secrets.token_hex(4)}"
    layout = Layout(root)
    layout.open()
    written = already = 0
    try:
        for i, block in enumerate(manifest.blocks):
            ref = BlockRef(manifest.namespace, block.key)
            try:
                # Read and checked again: the bundle may have changed since the check.
                data = read_block(bundle, manifest, block)
                stamp = time.time_ns()
                got = ledger.reserve(
                    ref, len(data), stamp, limits.cap_bytes, writer, _never, _unlinker(layout)
                )
                if isinstance(got, Refusal):
                    raise BundleError(
                        f"no room under the cap of {human_size(limits.cap_bytes or 0)} "
                        f"({limits.cap_reason}): the rest of the store is pinned or being "
                        f"written. Unpin a prefix or raise --max-size-gib"
                    )
                if isinstance(got, BlockState):
                    already += 1
                    continue
                _land(layout, ledger, ref, data, stamp, writer)
            except (BundleError, OSError, sqlite3.Error) as exc:
                done = f"{written + already} of {len(manifest.blocks)} blocks are in the store"
                raise BundleError(
                    f"import stopped at block {i} ({exc}); {done}, held by pin "
                    f"{manifest.pin.name!r}: import again to finish (blocks there are skipped), "
                    f"or unpin it."
                ) from None
            written += 1
    finally:
        layout.close()
    return written, already


def _land(layout: Layout, ledger: Ledger, ref: BlockRef, data: bytes, stamp: int, writer: str):
    """The reserved block written, durable, under its name, then committed;
    on any failure the reservation is released and no file is left."""
    try:
        with layout.block_dir(ref, create=True) as dir_fd:
            _write_file(layout.path(ref).name, data, dir_fd)
    except OSError:
        ledger.abort(ref, writer)
        raise
    try:
        ledger.commit(ref, len(data), stamp, writer)
    except sqlite3.Error:
        # Not in the ledger, so not counted: the file must go too.
        with contextlib.suppress(OSError):
            layout.unlink(ref)
        ledger.abort(ref, writer)
        raise


def _write_file(name: str, data: bytes, dir_fd: int) -> None:
    """``data`` as ``name`` in ``dir_fd``: a temp file, fsynced, renamed,
    and the rename made durable before the ledger says the block is there."""
    temp = temp_name(name)
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | SAFE_OPEN, 0o600, dir_fd=dir_fd)
    try:
        try:
            write_synced(fd, data)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def _never(_: BlockRef) -> bool:
    """No load of this process is in flight to protect."""
    return False


def _unlinker(layout: Layout):
    def unlink(ref: BlockRef) -> None:
        with contextlib.suppress(OSError):  # counted free: gone at the next start-up scan
            layout.unlink(ref)

    return unlink
