"""L3 directory layout, and what the disk tier finds there at start-up.

Runs once in the engine-core process, when the disk tier is built (before
serving), so it may do blocking I/O:

    root_dir/                      the user's directory (0700 if we create it)
      .noindex/                    0700; the name keeps desktop indexers
        <namespace id hex>/        (Spotlight, tracker) out: prompts can be
          namespace.json           recovered from KV bytes
          <2 hex>/<key hex>.kvb    block files, 0600 (see block_file.py)

A namespace is one model + dtype + KV layout: blocks of other namespaces
are never served, but they count toward the cap and may be evicted, since
the cap covers the whole root_dir.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from vllm_uma.kv_offload.block_file import (
    NAMESPACE_BYTES,
    TEMP_SUFFIX,
    block_path,
    is_temp_name,
    key_from_name,
)

NOINDEX = ".noindex"
NAMESPACE_FILE = "namespace.json"


class BlockRef(NamedTuple):
    """A block file: whose namespace, which key. The disk index's name."""

    namespace: bytes
    key: bytes


@dataclass(frozen=True)
class FoundBlock:
    ref: BlockRef
    size: int
    mtime_ns: int


class Layout:
    def __init__(self, root_dir: Path):
        self.root_dir = root_dir
        self.noindex = root_dir / NOINDEX

    def namespace_dir(self, namespace: bytes) -> Path:
        return self.noindex / namespace.hex()

    def path(self, ref: BlockRef) -> Path:
        return block_path(self.namespace_dir(ref.namespace), ref.key)

    def prepare(self, namespace: bytes, info: dict[str, Any]) -> str | None:
        """Create the private directories and (re)write namespace.json; the
        error if that file could not be written (it is for humans only: a
        full disk must not stop the server from starting)."""
        if len(namespace) != NAMESPACE_BYTES:
            raise ValueError(
                f"namespace id of {len(namespace)} bytes: it must be {NAMESPACE_BYTES}"
            )
        self.root_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory in (self.noindex, self.namespace_dir(namespace)):
            _private_dir(directory)
        path = self.namespace_dir(namespace) / NAMESPACE_FILE
        try:
            write_private_json(path, info)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        return None

    def scan(self) -> tuple[list[FoundBlock], int]:
        """Block files of every namespace, oldest mtime first, and the number
        of leftover temp files deleted on the way."""
        found: list[FoundBlock] = []
        removed = 0
        for ns_entry in _entries(self.noindex):
            if _remove_if_temp(ns_entry):
                removed += 1
                continue
            namespace = _namespace_of(ns_entry)
            if namespace is None:
                continue
            for sub in _entries(Path(ns_entry.path)):
                if _remove_if_temp(sub):
                    removed += 1
                elif sub.is_dir(follow_symlinks=False) and len(sub.name) == 2:
                    removed += self._scan_subdir(namespace, sub, found)
        found.sort(key=lambda block: block.mtime_ns)
        return found, removed

    def _scan_subdir(self, namespace: bytes, sub: os.DirEntry, found: list[FoundBlock]) -> int:
        removed = 0
        for entry in _entries(Path(sub.path)):
            if _remove_if_temp(entry):
                removed += 1
                continue
            key = key_from_name(entry.name)
            # A block file sits in the subdirectory its key names; anything
            # else is not ours to index (nor to delete).
            if key is None or not entry.name.startswith(sub.name):
                continue
            with contextlib.suppress(OSError):  # deleted meanwhile
                st = entry.stat(follow_symlinks=False)
                found.append(FoundBlock(BlockRef(namespace, key), st.st_size, st.st_mtime_ns))
        return removed


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove_if_temp(entry: os.DirEntry) -> bool:
    if not is_temp_name(entry.name) or not entry.is_file(follow_symlinks=False):
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(entry.path)
    return True


def _namespace_of(entry: os.DirEntry) -> bytes | None:
    if not entry.is_dir(follow_symlinks=False) or len(entry.name) != 2 * NAMESPACE_BYTES:
        return None
    try:
        return bytes.fromhex(entry.name)
    except ValueError:
        return None


def _private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, exist_ok=True)
    # An older or hand-made directory may be wider: ours, so tighten it.
    if directory.stat().st_mode & 0o077:
        directory.chmod(0o700)


def tree_bytes(directory: Path) -> int:
    """Bytes of every file under ``directory`` (0 if it does not exist)."""
    total = 0
    for parent, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):  # deleted meanwhile
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def write_private_json(path: Path, info: Any) -> None:
    """Write ``info`` as ``path`` (0600), atomically: a temp file the start-up
    scan knows as a leftover, renamed into place."""
    temp = path.with_name(f"{path.name}.{os.urandom(6).hex()}{TEMP_SUFFIX}")
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
