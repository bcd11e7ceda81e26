"""A volume that goes read-only under the disk tier, on a real ext4 file
system (a loop device, mounted errors=remount-ro) whose kernel is told to
meet an error (/sys/fs/ext4/<dev>/trigger_fs_error): ext4 then refuses
every write, as after a real I/O error. The running tier keeps serving its
restores and fails its stores (counted, never raised); a tier started on
it is refused with the volume, the cause and the fix."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from volume_kit import ext4_loop_mount, run_tool

from tests.unit.disk_tier_kit import Jobs, Primary, counters, key, make_tier
from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk.ledger.db import LedgerError


@pytest.fixture
def ext4(tmp_path):
    """An ext4 file system of 32 MiB on a loop device; yields (mount, trigger)."""
    with ext4_loop_mount(tmp_path, 32, "errors=remount-ro") as (_, mount):
        device = run_tool("findmnt", "-n", "-o", "SOURCE", str(mount)).stdout.strip()
        trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
        if not trigger.exists():
            pytest.skip(f"this kernel has no {trigger}")
        yield mount, trigger


def _break(trigger: Path, mount: Path) -> None:
    trigger.write_text("vllm-uma test\n")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # ext4 turns read-only within moments
        probe = mount / f"probe-{time.monotonic_ns()}"
        try:
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError:
            return
        time.sleep(0.05)
    raise AssertionError("the file system still takes writes after its error")


def test_a_volume_gone_read_only_keeps_restores_and_refuses_a_new_start(ext4):
    mount, trigger = ext4
    root = mount / "kv"
    primary = Primary()
    tier = make_tier(root, primary)
    jobs = Jobs(tier)
    for row in range(3):
        primary.fill(row, seed=row + 1)
    assert jobs.stored([key(0), key(1)], [0, 1]).success
    expected = primary.row(0)
    _break(trigger, mount)
    assert not jobs.stored([key(2)], [2]).success  # a store fails, nothing raised
    assert counters(tier.get_stats())[(m.NAMES.store_failed, ("ledger",))] >= 1
    primary.clear()
    assert jobs.loaded([key(0)], [3]).success  # restores go on
    assert primary.row(3) == expected
    tier.shutdown()
    refused = r"cannot be written .*refuses writes.*dmesg.*remount it read-write"
    with pytest.raises(LedgerError, match=refused):
        make_tier(root, primary)
