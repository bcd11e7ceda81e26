"""A full disk: only the kernel's ENOSPC pauses stores, and they come back
(vllm_uma/kv_offload/disk/full_disk.py), on a real small file system."""

from __future__ import annotations

import os
import subprocess

import pytest
from disk_tier_kit import FILE, Jobs, Primary, WarningLog, counters, key, make_tier

from vllm_uma.kv_offload.disk import metrics as m
from vllm_uma.kv_offload.disk.full_disk import FullDisk


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pause_backs_off_and_ends_when_space_is_back():
    clock = Clock()
    full = FullDisk(first_retry_s=5, max_retry_s=20, clock=clock)
    assert not full.paused
    assert full.on_full() is True  # the pause starts: log it
    assert full.paused and full.retry_in_s == 5
    # Stores sent before the pause fail too: no longer back-off for them.
    assert full.on_full() is False and full.retry_in_s == 5
    clock.now += 5
    assert not full.paused  # time to try again
    assert full.on_full() is False and full.retry_in_s == 10  # still full
    clock.now += 10
    full.on_full()
    assert full.retry_in_s == 20
    clock.now += 20
    full.on_full()
    assert full.retry_in_s == 20  # capped
    assert full.on_space() is True and not full.paused
    assert full.on_space() is False  # already resumed


@pytest.fixture
def small_fs(tmp_path):
    """A real 256 KiB file system (tmpfs with a size limit): writes past it
    fail with the kernel's own ENOSPC."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_stores_pause_on_a_real_enospc_and_resume_when_space_is_back(small_fs):
    primary = Primary()
    root = small_fs / "kv"
    # No cap: only the file system can refuse.
    now = [0.0]  # the pause's clock, moved by the test instead of a sleep
    full_disk = FullDisk(first_retry_s=5, clock=lambda: now[0])
    tier = make_tier(root, primary, full_disk=full_disk)
    jobs = Jobs(tier)
    filler = small_fs / "someone-elses-file"
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    filler.write_bytes(b"x" * (free - 2 * FILE))  # room for about one block
    for row in range(4):
        primary.fill(row, seed=row + 1)
    with WarningLog() as log:
        first = jobs.stored([key(0), key(1), key(2)], [0, 1, 2])
        assert not first.success  # some blocks did not fit
        paused = jobs.stored([key(3)], [3])
        assert not paused.success  # refused without trying, for now
        stats = counters(tier.get_stats())
        assert stats[(m.STORE_FAILED, ("disk_full",))] >= 2
        assert any("is full" in message for message in log.messages)
        filler.unlink()  # the other user frees space
        now[0] += 5  # the pause is over: the next store tries again
        resumed = jobs.stored([key(3)], [3])
    assert resumed.success
    primary.clear()
    assert jobs.loaded([key(3)], [7]).success
    tier.shutdown()
