"""A pin carried between stores: the bundle's format, and every check made before use.

Written by ``vllm-uma kv-store ROOT export`` (bundle_export.py), read by
``... import`` (bundle_import.py), in the administrator's process. A bundle
is a directory; its block files are copied byte for byte as the source
store holds them (header, payload, and a signed store's MAC):

    BUNDLE/
      manifest.json
      blocks/<key hex>.kvb        one per exported block, prefix order in the manifest

    manifest.json
    {"format": "vllm-uma-kv-bundle", "version": 1,
     "namespace": {"id": "<32 hex>", "info": {<the namespace's namespace.json>}},
     "pin": {"name": "system", "tokens": 8192, "ttl_s": 86000.0 or null,
             "keys": ["<key hex>", ...]},          every key of the pin, prefix order
     "block_bytes": 2953216,                       one block file, header included
     "blocks": [{"key": "<key hex>", "size": 2953216, "sha256": "<64 hex>"}, ...]}

``blocks`` is a prefix of ``pin.keys``: only a contiguous prefix is of use
to a request (a block after a gap is never restored), so an export stops at
the first block missing from the disk, and the pin still names the rest
(the target holds them once a warm-up stores them). ``ttl_s`` is what was
left of the pin at the export.

Nothing is trusted: the manifest is parsed strictly (unknown keys, another
format version, a block that is not the pin's next key are refused), and
each block file must have the manifest's size and sha256 and pass the
store's own header check (block_file.check_header: magic, format version,
namespace id, key, payload length and checksum) before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_uma.kv_offload.disk.block_file import (
    BLOCK_SUFFIX,
    HEADER_BYTES,
    MAX_KEY_BYTES,
    NAMESPACE_BYTES,
    SAFE_OPEN,
    BadBlock,
    check_header,
)
from vllm_uma.kv_offload.disk.block_read import MAX_PAYLOAD_BYTES
from vllm_uma.kv_offload.pins import book

FORMAT = "vllm-uma-kv-bundle"
VERSION = 1
MANIFEST = "manifest.json"
BLOCKS_DIR = "blocks"
# A pin of 128k tokens in 16-token blocks lists 8k keys twice: well under 4 MiB.
MAX_MANIFEST_BYTES = 16 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TOP_KEYS = frozenset({"format", "version", "namespace", "pin", "block_bytes", "blocks"})


class BundleError(ValueError):
    """A bundle that cannot be written or used; the message says why and the fix."""


@dataclass(frozen=True)
class BundleBlock:
    key: bytes
    size: int
    sha256: str

    @property
    def file_name(self) -> str:
        return self.key.hex() + BLOCK_SUFFIX

    def as_json(self) -> dict:
        return {"key": self.key.hex(), "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class BundlePin:
    name: str
    tokens: int
    ttl_s: float | None  # what was left at the export; None: until unpinned
    keys: tuple[bytes, ...]  # every block of the pin, prefix order

    def as_json(self) -> dict:
        keys = [key.hex() for key in self.keys]
        return {"name": self.name, "tokens": self.tokens, "ttl_s": self.ttl_s, "keys": keys}


@dataclass(frozen=True)
class Manifest:
    namespace: bytes
    namespace_info: dict
    pin: BundlePin
    block_bytes: int
    blocks: tuple[BundleBlock, ...]  # a prefix of pin.keys

    @property
    def model(self) -> str:
        return str(self.namespace_info.get("model", "?"))

    def as_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "namespace": {"id": self.namespace.hex(), "info": self.namespace_info},
            "pin": self.pin.as_json(),
            "block_bytes": self.block_bytes,
            "blocks": [block.as_json() for block in self.blocks],
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """The manifest, checked; BundleError naming the first thing wrong."""
        top = _object(data, "the manifest", _TOP_KEYS)
        if top["format"] != FORMAT:
            raise BundleError(f"format {top['format']!r} is not a vllm-uma KV bundle ({FORMAT!r})")
        if top["version"] != VERSION:
            raise BundleError(
                f"bundle format version {top['version']!r}: this vllm-uma reads version "
                f"{VERSION}. Import it with the vllm-uma that exported it, or export it again."
            )
        ns = _object(top["namespace"], "namespace", frozenset({"id", "info"}))
        namespace = _hex(ns["id"], "namespace.id", NAMESPACE_BYTES, NAMESPACE_BYTES)
        if not isinstance(ns["info"], dict):
            raise BundleError(f"namespace.info must be an object, not {ns['info']!r:.60}")
        pin = _pin(_object(top["pin"], "pin", frozenset({"name", "tokens", "ttl_s", "keys"})))
        block_bytes = _int(top["block_bytes"], "block_bytes", HEADER_BYTES + 1, _MAX_FILE)
        blocks = _blocks(top["blocks"], pin.keys, block_bytes)
        return cls(namespace, ns["info"], pin, block_bytes, blocks)


_MAX_FILE = HEADER_BYTES + MAX_PAYLOAD_BYTES


def _object(value: Any, where: str, keys: frozenset[str]) -> dict:
    if not isinstance(value, dict):
        raise BundleError(f"{where} must be a JSON object, not {value!r:.60}")
    unknown, missing = sorted(set(value) - keys), sorted(keys - set(value))
    if unknown or missing:
        raise BundleError(
            f"{where} has unknown key(s) {unknown} and lacks {missing}; it must have "
            f"exactly {sorted(keys)}."
        )
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BundleError(f"{where}={value!r:.60} is invalid: an integer from {low} to {high}")
    return value


def _hex(value: Any, where: str, low: int, high: int) -> bytes:
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or raw.hex() != value or not low <= len(raw) <= high:
        raise BundleError(
            f"{where}={value!r:.80} is invalid: lower-case hex of {low} to {high} bytes"
        )
    return raw


def _pin(pin: dict) -> BundlePin:
    try:
        name = book.check_name(pin["name"])
        ttl_s = book.check_ttl(pin["ttl_s"])
    except book.PinError as exc:
        raise BundleError(f"pin: {exc}") from None
    tokens = _int(pin["tokens"], "pin.tokens", 1, 1 << 40)
    if not isinstance(pin["keys"], list) or not pin["keys"]:
        raise BundleError(f"pin.keys must be a non-empty list of keys, not {pin['keys']!r:.60}")
    keys = tuple(_hex(k, f"pin.keys[{i}]", 1, MAX_KEY_BYTES) for i, k in enumerate(pin["keys"]))
    if len(set(keys)) != len(keys):
        raise BundleError("pin.keys names a block twice: a pin's keys are a prefix's, all distinct")
    return BundlePin(name, tokens, ttl_s, keys)


def _blocks(value: Any, keys: tuple[bytes, ...], block_bytes: int) -> tuple[BundleBlock, ...]:
    if not isinstance(value, list) or not 0 < len(value) <= len(keys):
        raise BundleError(
            f"blocks must be a list of 1 to {len(keys)} blocks (a prefix of pin.keys), "
            f"not {value!r:.60}"
        )
    blocks = []
    for i, entry in enumerate(value):
        where = f"blocks[{i}]"
        entry = _object(entry, where, frozenset({"key", "size", "sha256"}))
        key = _hex(entry["key"], f"{where}.key", 1, MAX_KEY_BYTES)
        if key != keys[i]:
            raise BundleError(
                f"{where}.key {key.hex()} is not the pin's block {i} ({keys[i].hex()}): "
                f"blocks must be a prefix of pin.keys, in order"
            )
        size = _int(entry["size"], f"{where}.size", block_bytes, block_bytes)
        sha = entry["sha256"]
        if not isinstance(sha, str) or _SHA256.fullmatch(sha) is None:
            raise BundleError(f"{where}.sha256={sha!r:.80} is not 64 lower-case hex digits")
        blocks.append(BundleBlock(key, size, sha))
    return tuple(blocks)


def read_manifest(bundle: Path) -> Manifest:
    data = read_file(bundle / MANIFEST, MAX_MANIFEST_BYTES, what="manifest")
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise BundleError(f"{bundle / MANIFEST} is not JSON ({exc})") from None
    try:
        return Manifest.from_json(parsed)
    except BundleError as exc:
        raise BundleError(f"{bundle / MANIFEST}: {exc}") from None


def read_file(
    path: Path, max_bytes: int, *, size: int | None = None, what: str, dir_fd: int | None = None
) -> bytes:
    """A regular file's bytes (never through a symlink, never a FIFO's
    wait), refused if over ``max_bytes`` or not ``size`` before it is read.
    With ``dir_fd`` (a handle on its directory) only ``path.name`` is resolved."""
    try:
        fd = os.open(path if dir_fd is None else path.name, os.O_RDONLY | SAFE_OPEN, dir_fd=dir_fd)
    except OSError as exc:
        raise BundleError(f"{what} {path} cannot be opened: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{what} {path} is not a regular file")
        if st.st_size > max_bytes or (size is not None and st.st_size != size):
            want = f"the {size} expected" if size is not None else f"at most {max_bytes}"
            raise BundleError(f"{what} {path} is {st.st_size} bytes, not {want}")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(st.st_size + 1)
    except OSError as exc:
        raise BundleError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) != st.st_size:
        raise BundleError(f"{what} {path} changed size while read")
    return data


def check_block(data: bytes, path: Path | str, block: BundleBlock, namespace: bytes) -> None:
    """``data`` is the block file the manifest lists: its size, its sha256,
    and the header the store itself checks on every restore."""
    if len(data) != block.size:
        raise BundleError(f"block file {path} is {len(data)} bytes, not the {block.size} listed")
    digest = hashlib.sha256(data).hexdigest()
    if digest != block.sha256:
        raise BundleError(
            f"block file {path} does not match the manifest (sha256 {digest}, the manifest says "
            f"{block.sha256}): it changed or was damaged since the export. Export the pin again."
        )
    view = memoryview(data)
    try:
        check_header(view[:HEADER_BYTES], path, block.key, namespace, view[HEADER_BYTES:])
    except BadBlock as bad:
        raise BundleError(
            f"block file {bad}: the bundle is damaged, or the file is not the block the manifest "
            f"names. Export the pin again."
        ) from None


def read_block(bundle: Path, manifest: Manifest, block: BundleBlock) -> bytes:
    """One of the bundle's block files, read and checked (check_block)."""
    path = bundle / BLOCKS_DIR / block.file_name
    data = read_file(path, block.size, size=block.size, what="block file")
    check_block(data, path, block, manifest.namespace)
    return data


def check_bundle(bundle: Path) -> Manifest:
    """The bundle's manifest, once every block file it lists is checked."""
    manifest = read_manifest(bundle)
    for block in manifest.blocks:
        read_block(bundle, manifest, block)
    return manifest


def write_synced(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a write may take part of it), then fsync:
    an export's file and an import's block alike are whole on disk before
    they are renamed in."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)
