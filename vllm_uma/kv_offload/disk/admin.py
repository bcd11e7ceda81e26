"""``vllm-uma kv-store ROOT ls|du|verify|prune|clear``: look after a store.

Runs in the administrator's own process, never in a server. It is safe while
servers use the store, because of how the tier treats the files:
- a block file removed under a running server is a clean miss for it (the
  load finds it MISSING, counts it and recomputes the block): never wrong
  data, and a load already reading the file finishes from its open handle;
- every deletion also removes the block's row from the store's shared
  ledger (ledger/), in one transaction, so servers see it go and the
  bytes counted toward the cap stay right;
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
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_uma.kv_offload.disk.block_file import BadBlock, is_temp_name, key_from_name
from vllm_uma.kv_offload.disk.block_read import declared_payload_bytes, read_block
from vllm_uma.kv_offload.disk.layout import (
    NAMESPACE_FILE,
    NOINDEX,
    BlockRef,
    Layout,
    read_json_file,
)
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.db import LEDGER_FILE, LedgerError

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


def open_ledger(root: Path) -> Ledger | None:
    """The store's ledger, its schema brought up to date (as a server's
    start-up does: pins need their tables); None if the store has none (a
    store older than the ledger: no server has run on it since)."""
    noindex = store_dir(root)
    if not (noindex / LEDGER_FILE).exists():
        return None
    ledger = Ledger(noindex)
    try:
        ledger.create()
    except (sqlite3.Error, LedgerError) as exc:
        ledger.close()
        raise StoreError(f"the store's ledger {ledger.path} cannot be used: {exc}") from exc
    return ledger


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
    info = read_json_file(ns_dir / NAMESPACE_FILE)
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
    with _Deleter(root) as deleter:
        _verify(root, remove, report, deleter)
    return report


def _verify(root: Path, remove: bool, report: VerifyReport, deleter: _Deleter) -> None:
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
                if remove and deleter.delete(block):
                    report.removed += 1
            except OSError as exc:  # this process's trouble (EMFILE...): report, keep
                report.bad.append((block.path, f"not checked: {exc}"))


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
    chosen = []
    for ns, ns_dir in namespaces(root):
        if namespace is not None and ns != namespace:
            continue
        if missing_models and not _model_is_gone(read_info(ns_dir)):
            continue
        chosen += [b for b in walk(ns, ns_dir) if cutoff_ns is None or b.mtime_ns < cutoff_ns]
    if dry_run:
        return len(chosen), sum(block.size for block in chosen)
    return _delete(root, chosen)


def clear(root: Path) -> tuple[int, int]:
    """Delete every block file of every namespace (temp files excepted)."""
    return _delete(root, [b for ns, ns_dir in namespaces(root) for b in walk(ns, ns_dir)])


def _delete(root: Path, blocks: list[BlockFile]) -> tuple[int, int]:
    files = nbytes = 0
    with _Deleter(root) as deleter:
        for block in blocks:
            if deleter.delete(block):
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


class _Deleter:
    """Deletes block files ``walk`` found, each with its ledger row in one
    transaction: servers sharing the store see it go (a clean miss), and the
    store's count of bytes toward the cap stays right. Files are reached
    through directory handles opened without following links: a
    subdirectory swapped for a symlink since the walk is not followed."""

    WRITER = "kv-store"

    def __init__(self, root: Path):
        self._layout = Layout(root)
        self._layout.open()
        ledger_path = root / NOINDEX / LEDGER_FILE
        self._ledger = Ledger(root / NOINDEX) if ledger_path.exists() else None

    def __enter__(self) -> _Deleter:
        return self

    def __exit__(self, *exc) -> None:
        if self._ledger is not None:
            self._ledger.close()
        self._layout.close()

    def delete(self, block: BlockFile) -> bool:
        """True if the file was there and is gone now."""
        key = key_from_name(block.path.name)
        assert key is not None  # walk yields block names only
        ref = BlockRef(bytes.fromhex(block.namespace), key)
        removed: list[bool] = []

        def unlink(r: BlockRef) -> None:
            removed.append(self._unlink(r))

        if self._ledger is not None:
            try:
                self._ledger.forget([ref], self.WRITER, unlink)
            except sqlite3.Error as exc:
                raise StoreError(
                    f"the store's ledger {self._ledger.path} cannot be written ({exc}); "
                    "nothing more was deleted. Try again when the servers are less busy."
                ) from exc
        # A file the ledger does not know (an older store): the file alone.
        return removed[0] if removed else self._unlink(ref)

    def _unlink(self, ref: BlockRef) -> bool:
        try:
            return self._layout.unlink(ref)
        except OSError:
            return False  # its directory went meanwhile, or is not ours
