"""Test kit for the disk tier's volume faults: a real ext4 on a loop device,
made and mounted as root, for the tests of a volume gone read-only or
failing its writes (test_disk_read_only.py, test_disk_eio.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def run_tool(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


@contextlib.contextmanager
def ext4_loop_mount(directory: Path, size_mib: int, options: str) -> Iterator[tuple[Path, Path]]:
    """A fresh ext4 of ``size_mib`` in an image under ``directory``, mounted
    ``-o loop,OPTIONS``; yields (image, mount), unmounted at the end. Skips
    the test where this machine cannot (not root, no mkfs.ext4, no loop)."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("an ext4 loop mount needs root and mkfs.ext4")
    image, mount = directory / "ext4.img", directory / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    made = run_tool("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    mounted = run_tool("mount", "-o", f"loop,{options}", str(image), str(mount))
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount ext4 here: {mounted.stderr.strip()}")
    try:
        yield image, mount
    finally:
        run_tool("umount", "-l", str(mount))
