"""A device that fails every write with EIO, under the disk tier: a real ext4
file system on a loop device whose backing file is made immutable
(``chattr +i``), so that the loop driver fails each write from then on with
a block-layer I/O error ("I/O error, dev loopN ... op WRITE" in the kernel
log) while reads still succeed. ext4 (mounted errors=continue) passes the
EIO to the writer; its journal then aborts and it turns read-only, as on a
failing disk. No errno is injected: the error comes from the kernel.

The running tier keeps restoring what it stored and fails the stores
(counted, never raised, no half-written block left where a restore would
find it); a tier started on the volume afterwards restores what is there
(a volume already read-only at its start is refused: test_disk_read_only)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import LookupResult
from volume_kit import ext4_loop_mount, run_tool

from tests.unit.disk_tier_kit import CTX, Jobs, Primary, block_files, counters, key, make_tier
from vllm_uma.kv_offload.disk import reports as m


@pytest.fixture
def failing_device(tmp_path):
    """An ext4 of 64 MiB on a loop device; yields (mount, fail), where
    ``fail()`` makes the device fail every write from then on."""
    if shutil.which("chattr") is None:
        pytest.skip("a failing loop device needs chattr")
    with ext4_loop_mount(tmp_path, 64, "errors=continue") as (image, mount):

        def fail() -> None:
            # The loop driver writes through its open descriptor; an
            # immutable file refuses those writes (EPERM), reported as EIO.
            result = run_tool("chattr", "+i", str(image))
            if result.returncode != 0:
                pytest.skip(f"chattr +i failed on {image}: {result.stderr.strip()}")

        try:
            yield mount, fail
        finally:
            run_tool("chattr", "-i", str(image))  # else the image cannot be removed


def _write_sees_eio(mount: Path) -> bool:
    """Whether an O_DIRECT write and fsync on ``mount`` now fail with EIO."""
    import mmap

    buf = mmap.mmap(-1, 1 << 16)
    path = mount / "probe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            os.write(fd, buf)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno == 5
    return False


def test_a_device_failing_writes_keeps_restores_and_fails_stores_cleanly(failing_device):
    mount, fail = failing_device
    root = mount / "kv"
    primary = Primary(aligned=True)
    tier = make_tier(root, primary)
    jobs = Jobs(tier)
    for row in range(4):
        primary.fill(row, seed=row + 1)
    assert jobs.stored([key(0), key(1)], [0, 1]).success
    expected = primary.row(0)
    fail()
    assert _write_sees_eio(mount)  # a real EIO from the kernel, not an injected one
    assert not jobs.stored([key(2), key(3)], [2, 3]).success  # fails, nothing raised
    assert counters(tier.get_stats())[(m.NAMES.store_failed, ("io_error",))] >= 1
    primary.clear()
    assert jobs.loaded([key(0)], [3]).success  # what was stored is still restored
    assert primary.row(3) == expected
    # No half-written block a restore could find: the failed keys are misses,
    # and only the two stored blocks are block files.
    assert [tier.lookup(key(i), CTX) for i in (2, 3)] == [LookupResult.MISS] * 2
    assert len(block_files(root)) == 2
    tier.shutdown()
    # A server started on it meanwhile: its start-up needs no write (the
    # ledger knows every file), so it starts and restores what is there.
    again = make_tier(root, primary)
    try:
        assert again.lookup(key(0), CTX) is LookupResult.HIT
        primary.clear()
        assert Jobs(again).loaded([key(0)], [1]).success
        assert primary.row(1) == expected
    finally:
        again.shutdown()
