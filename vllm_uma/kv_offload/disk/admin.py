"""``vllm-uma kv-store ROOT ls|du|verify|prune|clear``: look after a store.

Runs in the administrator's own process, never in a server. It is safe while
servers use the store, because of how the tier treats the files:
- a block file removed under a running server is a clean miss for it (the
  load finds it MISSING, counts it and recomputes the block): never wrong
  data, and a load already reading the file finishes from its open handle;
- temp files (``*.tmp``) are writes in flight, a server's or a crashed one's:
  this command never deletes them (a server's start-up removes its own
  leftovers);
- nothing is followed as a symlink nor read unless it is a regular file.

What it reads: ``ROOT/.noindex/<namespace>/namespace.json`` (what made the
namespace: model, dtypes, layout) and the block files' sizes and mtimes
(a block's mtime is its last store or restore, the LRU order).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_uma.kv_offload.disk.block_file import (
    BadBlock,
    declared_payload_bytes,
    is_temp_name,
    key_from_name,
    read_block,
)
from vllm_uma.kv_offload.disk.layout import NAMESPACE_FILE, NOINDEX, Layout

NAMESPACE_HEX = 32


class StoreError(ValueError):
    """ROOT is not a store this command can work on; the message says why."""


@dataclass(frozen=True)
class BlockFile:
    namespace: str  # hex id
    path: Path
    size: int
    mtime_ns: int


@dataclass
class NamespaceSummary:
    namespace: str
    info: dict | None
    blocks: int = 0
    bytes: int = 0
    last_use_ns: int = 0
    temp_files: int = 0

    @property
    def model(self) -> str:
        return str((self.info or {}).get("model", "?"))


@dataclass
class VerifyReport:
    checked: int = 0
    bad: list[tuple[Path, str]] = field(default_factory=list)  # path, why
    removed: int = 0


def store_dir(root: Path) -> Path:
    noindex = root / NOINDEX
    try:
        st = os.lstat(noindex)
    except FileNotFoundError:
        raise StoreError(
            f"{root} is not a vllm-uma KV store: it has no {NOINDEX} directory. "
            f"Pass the root_dir of an fs tier."
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{noindex} is not a directory (a symlink?); not a store to touch.")
    return noindex


def _dirs(directory: Path) -> Iterator[os.DirEntry]:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    yield entry


def namespaces(root: Path) -> Iterator[tuple[str, Path]]:
    for entry in _dirs(store_dir(root)):
        if len(entry.name) == NAMESPACE_HEX and _is_hex(entry.name):
            yield entry.name, Path(entry.path)


def _is_hex(name: str) -> bool:
    try:
        bytes.fromhex(name)
    except ValueError:
        return False
    return True


def walk(ns: str, ns_dir: Path, summary: NamespaceSummary | None = None) -> Iterator[BlockFile]:
    """The block files of one namespace (regular files with a block's name
    in the subdirectory that name belongs to); counts temp files."""
    for sub in _dirs(ns_dir):
        with contextlib.suppress(FileNotFoundError), os.scandir(sub.path) as entries:
            for entry in entries:
                if is_temp_name(entry.name):
                    if summary is not None:
                        summary.temp_files += 1
                    continue
                if key_from_name(entry.name) is None or not entry.name.startswith(sub.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        yield BlockFile(ns, Path(entry.path), st.st_size, st.st_mtime_ns)


def read_info(ns_dir: Path) -> dict | None:
    try:
        fd = os.open(ns_dir / NAMESPACE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def survey(root: Path) -> list[NamespaceSummary]:
    """Per namespace: what made it, blocks, bytes, last use. Most recent first."""
    summaries = []
    for ns, ns_dir in namespaces(root):
        summary = NamespaceSummary(ns, read_info(ns_dir))
        for block in walk(ns, ns_dir, summary):
            summary.blocks += 1
            summary.bytes += block.size
            summary.last_use_ns = max(summary.last_use_ns, block.mtime_ns)
        summaries.append(summary)
    return sorted(summaries, key=lambda s: s.last_use_ns, reverse=True)


def verify(root: Path, remove: bool) -> VerifyReport:
    """Read every block file and check it as a restore would (header, key,
    namespace, length, checksum); with ``remove``, delete the bad ones."""
    report = VerifyReport()
    for ns, ns_dir in namespaces(root):
        namespace = bytes.fromhex(ns)
        for block in walk(ns, ns_dir):
            report.checked += 1
            try:
                payload = bytearray(declared_payload_bytes(block.path))
                key = key_from_name(block.path.name)
                assert key is not None  # walk yields block names only
                read_block(block.path, key, namespace, memoryview(payload), direct=False)
            except BadBlock as bad:
                report.bad.append((block.path, f"{bad.reason.value}: {bad.detail}"))
                if remove and _unlink(block.path):
                    report.removed += 1
            except OSError as exc:  # this process's trouble (EMFILE...): report, keep
                report.bad.append((block.path, f"not checked: {exc}"))
    return report


def prune(
    root: Path,
    *,
    older_than_s: float | None = None,
    namespace: str | None = None,
    missing_models: bool = False,
    dry_run: bool = False,
) -> tuple[int, int]:
    """Delete the blocks that match every given criterion: last used more than
    ``older_than_s`` ago, in ``namespace``, of a model directory that no
    longer exists. Returns (files, bytes) deleted (or that would be)."""
    if older_than_s is None and namespace is None and not missing_models:
        raise StoreError(
            "prune needs a criterion: --older-than DAYS, --namespace ID or "
            "--missing-models (use `clear` to delete everything)."
        )
    cutoff_ns = None if older_than_s is None else time.time_ns() - int(older_than_s * 1e9)
    files = nbytes = 0
    for ns, ns_dir in namespaces(root):
        if namespace is not None and ns != namespace:
            continue
        if missing_models and not _model_is_gone(read_info(ns_dir)):
            continue
        for block in walk(ns, ns_dir):
            if cutoff_ns is not None and block.mtime_ns >= cutoff_ns:
                continue
            if dry_run or _unlink(block.path):
                files += 1
                nbytes += block.size
    return files, nbytes


def clear(root: Path) -> tuple[int, int]:
    """Delete every block file of every namespace (temp files excepted)."""
    files = nbytes = 0
    for ns, ns_dir in namespaces(root):
        for block in walk(ns, ns_dir):
            if _unlink(block.path):
                files += 1
                nbytes += block.size
    return files, nbytes


def _model_is_gone(info: dict | None) -> bool:
    """A namespace whose model was an absolute directory path that is no
    longer there. A hub name, a relative or ``~`` path (relative to whose
    directory?), or an unknown namespace is kept: nothing proves it gone."""
    model = (info or {}).get("model")
    if not isinstance(model, str) or not model.startswith("/"):
        return False
    return not Path(model).is_dir()


def _unlink(path: Path) -> bool:
    """Remove a block file found by ``walk``, through directory handles
    opened without following links: a subdirectory swapped for a symlink
    since the walk is not followed."""
    root = path.parents[3]
    layout = Layout(root)
    try:
        layout.open()
        dir_fd = layout.open_dir((NOINDEX, path.parent.parent.name, path.parent.name), create=False)
    except OSError:
        return False
    finally:
        layout.close()
    try:
        os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False  # a server evicted it meanwhile
    finally:
        os.close(dir_fd)
    return True
