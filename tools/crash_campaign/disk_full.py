"""A full disk for the crash campaign's rounds: the file system under the
store filled to its last byte, and given back.

Runs in the driver. The store lives on a small tmpfs of the campaign's own
(``mount_small_fs``, root only), so a filler file beside the store can take
every free byte: block writes, temp files and the ledger's SQLite pages then
fail with ENOSPC wherever they are, on whatever server, while kills go on.
The check after the round holds the store to the same invariants as any
other round: a full disk may cost blocks, never a lie in the ledger, a temp
file left or a block past the cap.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

CHUNKS = (1 << 20, 1 << 16, 1 << 12, 1 << 9)  # bytes per write, down to the last ones


class SmallFsError(RuntimeError):
    """The campaign's small file system could not be mounted; says why and the fix."""


def mount_small_fs(mount: Path, size_bytes: int) -> None:
    """A tmpfs of ``size_bytes`` at ``mount`` (an empty directory), mode 0700."""
    if os.geteuid() != 0:
        raise SmallFsError(
            "--full-disk-share needs root to mount the campaign's small tmpfs; run it as "
            "root, or without --full-disk-share"
        )
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise SmallFsError(f"cannot mount a tmpfs at {mount}: {made.stderr.strip()}")


def unmount(mount: Path) -> None:
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


class DiskFiller:
    """Fills and frees the file system that holds ``path`` (a file of ours)."""

    def __init__(self, path: Path):
        self.path = path
        self.full = False

    def set_full(self, full: bool) -> None:
        if full and not self.full:
            self._fill()
        elif not full and self.full:
            self.path.unlink(missing_ok=True)
        self.full = full

    def _fill(self) -> None:
        """Write until the file system refuses even the smallest chunk."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in CHUNKS:
                chunk = bytes(size)
                while True:
                    try:
                        os.write(fd, chunk)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
