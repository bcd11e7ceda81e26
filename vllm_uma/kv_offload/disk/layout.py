"""L3 directory layout: where each file lives under root_dir, reached safely.

Engine-core process: the disk tier's start-up prepares the directories
(blocking I/O is fine then), and its I/O threads walk them for every block
file; ``vllm-uma kv-store`` walks them too (the administrator's process):

    root_dir/                      the user's directory (0700 if we create it)
      .noindex/                    0700; the name keeps desktop indexers
        <namespace id hex>/        (Spotlight, tracker) out: prompts can be
          namespace.json           recovered from KV bytes
          <2 hex>/<key hex>.kvb    block files, 0600 (see block_file.py)

A namespace is one model + dtype + KV layout: blocks of other namespaces
are never served, but they count toward the cap and may be evicted, since
the cap covers the whole root_dir.

Paths inside the store are never resolved by the kernel from the top: the
tier holds a handle on root_dir (checked at start-up, disk/trust.py) and
walks ``.noindex``, the namespace and the 2-hex subdirectory one component
at a time with ``O_NOFOLLOW | O_DIRECTORY`` (:meth:`Layout.block_dir`), so a
symlink planted anywhere inside cannot send a read or a write elsewhere: the
walk fails with ELOOP or ENOTDIR, and the block is a miss. Directories the
tier creates are 0700. What a store holds is found at start-up by
store_scan.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from vllm_uma.kv_offload.disk.block_file import (
    NAMESPACE_BYTES,
    FileId,
    block_path,
    file_id,
    temp_name,
)

NOINDEX = ".noindex"
NAMESPACE_FILE = "namespace.json"


class BlockRef(NamedTuple):
    """A block file: whose namespace, which key. The disk index's name."""

    namespace: bytes
    key: bytes


# Open a directory component: never through a symlink, never inherited.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Layout:
    def __init__(self, root_dir: Path):
        self.root_dir = root_dir
        self.noindex = root_dir / NOINDEX
        self._root_fd: int | None = None

    def namespace_dir(self, namespace: bytes) -> Path:
        return self.noindex / namespace.hex()

    def path(self, ref: BlockRef) -> Path:
        """Where a block lives, for messages; I/O goes through block_dir."""
        return block_path(self.namespace_dir(ref.namespace), ref.key)

    def open(self) -> None:
        """Hold a handle on root_dir: every later walk starts from it."""
        if self._root_fd is None:
            # Checked (or created) by the API server already; created again
            # if it went away since.
            self.root_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._root_fd = os.open(self.root_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def untrusted(self) -> str | None:
        """The trust rule (trust.py) that root_dir or .noindex breaks, judged
        on the handles this layout holds and walks from (fstat: nothing can
        be swapped in between the check and the use); None if both are
        sound. The API server checked the same paths minutes earlier, by
        name; this is the engine core's own look."""
        from vllm_uma.kv_offload.disk.trust import untrusted_reason  # trust imports us

        self.open()
        assert self._root_fd is not None
        reason = untrusted_reason(self.root_dir, os.fstat(self._root_fd), "root_dir")
        if reason is None:
            fd = self.open_dir((NOINDEX,), create=True)
            try:
                reason = untrusted_reason(self.noindex, os.fstat(fd), "store directory")
            finally:
                os.close(fd)
        return reason

    def ensure_store_dir(self) -> None:
        """Create ``.noindex`` (0700) if missing, without following a link."""
        self.open()
        os.close(self.open_dir((NOINDEX,), create=True))

    @contextlib.contextmanager
    def block_dir(self, ref: BlockRef, *, create: bool) -> Iterator[int]:
        """A handle on the directory of ``ref``'s file, reached without
        following a symlink; created (0700) on the way if ``create``.
        Raises OSError: ELOOP or ENOTDIR where something planted is in the
        way, ENOENT where a directory is missing and ``create`` is False."""
        sub = self.path(ref).parent.name
        fd = self.open_dir((NOINDEX, ref.namespace.hex(), sub), create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def unlink(self, ref: BlockRef) -> bool:
        """Delete ``ref``'s file (unlink never follows the name); False if
        none was there. Raises OSError for any other failure."""
        try:
            with self.block_dir(ref, create=False) as dir_fd:
                os.unlink(self.path(ref).name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        return True

    def identity(self, ref: BlockRef) -> FileId | None:
        """Which file is under ``ref``'s name now (None: none reachable), to
        tell the file a load found bad from a fresh copy a peer stored since."""
        try:
            with self.block_dir(ref, create=False) as dir_fd:
                st = os.stat(self.path(ref).name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        return file_id(st)

    def exists(self, ref: BlockRef) -> bool:
        """Whether something is under ``ref``'s name (start-up only)."""
        try:
            with self.block_dir(ref, create=False) as dir_fd:
                os.stat(self.path(ref).name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def open_dir(self, parts: tuple[str, ...], *, create: bool) -> int:
        """A handle on root_dir/part/part/..., each component opened with
        O_NOFOLLOW from the one before; the caller closes it."""
        if self._root_fd is None:
            raise RuntimeError("Layout.open() was not called")
        fd = os.dup(self._root_fd)
        for part in parts:
            fd = _step(fd, part, create)  # closes the parent, raised or not
        return fd

    def prepare(self, namespace: bytes, info: dict[str, Any]) -> str | None:
        """Create the private directories and (re)write namespace.json; the
        error if that file could not be written (it is for humans only: a
        full disk must not stop the server from starting)."""
        if len(namespace) != NAMESPACE_BYTES:
            raise ValueError(
                f"namespace id of {len(namespace)} bytes: it must be {NAMESPACE_BYTES}"
            )
        self.open()
        ns_fd = self.open_dir((NOINDEX, namespace.hex()), create=True)
        path = self.namespace_dir(namespace) / NAMESPACE_FILE
        try:
            write_private_json(path, info, dir_fd=ns_fd)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        finally:
            os.close(ns_fd)
        return None


def _step(parent_fd: int, name: str, create: bool) -> int:
    """Open directory ``name`` under ``parent_fd`` (closing the parent),
    creating it 0700 if asked and missing."""
    try:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # another thread made it
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    finally:
        os.close(parent_fd)
    if create:
        try:
            _tighten(fd)
        except OSError:
            os.close(fd)
            raise
    return fd


def _tighten(dir_fd: int) -> None:
    """A directory of ours made wider by hand or an older version: 0700
    again (through the handle: no path to race). Another user's is left as
    it is; start-up refuses a root_dir or .noindex not ours (trust.py)."""
    st = os.fstat(dir_fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(dir_fd, 0o700)


def read_json_file(path: Path) -> Any:
    """The JSON in the regular file ``path``; None if it cannot be read or
    parsed. Not followed if a link, not waited on if a FIFO: whoever can
    write the directory cannot make the reader open another file or hang."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_private_json(path: Path, info: Any, *, dir_fd: int | None = None) -> None:
    """Write ``info`` as ``path`` (0600), atomically: a temp file the start-up
    scan knows as a leftover, renamed into place. With ``dir_fd`` (a handle
    on ``path``'s directory) only the names are resolved, relative to it."""
    temp = temp_name(path.name)
    if dir_fd is None:
        temp, final = str(path.with_name(temp)), str(path)
    else:
        final = path.name
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.rename(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
