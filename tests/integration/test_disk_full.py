"""A full disk: only the kernel's ENOSPC pauses stores, and they come back
(vllm_uma/kv_offload/disk/full_disk.py), on a real small file system (a
tmpfs mounted as root). The pause's back-off alone: tests/unit/test_full_disk_pause.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.unit.disk_tier_kit import CTX, FILE, Jobs, Primary, WarningLog, counters, key, make_tier
from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk.full_disk import FullDisk


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
        assert stats[(m.NAMES.store_failed, ("disk_full",))] >= 2
        assert any("is full" in message for message in log.messages)
        filler.unlink()  # the other user frees space
        now[0] += 5  # the pause is over: the next store tries again
        resumed = jobs.stored([key(3)], [3])
    assert resumed.success
    primary.clear()
    assert jobs.loaded([key(3)], [7]).success
    tier.shutdown()


def test_a_start_on_a_full_disk_serves_and_settles_the_store_once_there_is_space(small_fs):
    """The start-up's reconcile cannot write the ledger on a full volume: the
    tier starts with what the ledger lists, and settles the rest (a crashed
    writer's row, a file the ledger lost) once a store finds space; its
    changes reach the tier's own index (full_disk.py)."""
    import sqlite3

    from tools.crash_campaign.disk_full import DiskFiller
    from vllm_uma.kv_offload.disk.index import BlockState

    primary = Primary()
    root = small_fs / "kv"
    first = make_tier(root, primary)
    for row in range(3):
        primary.fill(row, seed=row + 1)
    assert Jobs(first).stored([key(0), key(1)], [0, 1]).success
    first.shutdown()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no live process has: a crashed writer's
    db = sqlite3.connect(root / ".noindex" / "ledger.sqlite3")
    with db:  # key 1's row lost; key 5 left being written by the dead writer
        db.execute("DELETE FROM blocks WHERE key=?", (key(1),))
        db.execute(
            "INSERT INTO blocks (ns, key, size, state, last_use, writer, writer_pid, since) "
            "SELECT ns, ?, size, ?, last_use, 'crashed', ?, since FROM blocks WHERE key=?",
            (key(5), BlockState.WRITING, gone.pid, key(0)),
        )
    filler = DiskFiller(small_fs / "filler")
    filler.set_full(True)
    with WarningLog() as log:
        second = make_tier(root, primary)  # starts all the same
    assert any("could not bring the shared ledger up to date" in m for m in log.messages)
    jobs = Jobs(second)
    assert second.lookup(key(0), CTX).name == "HIT"  # listed: restored meanwhile
    assert second.lookup(key(1), CTX).name == "MISS"  # not yet
    primary.clear()
    assert jobs.loaded([key(0)], [3]).success
    filler.set_full(False)
    assert jobs.stored([key(2)], [2]).success  # asks for the settling too
    second.drain_jobs()  # the settling ran; the feed read its changes
    second.get_finished_jobs()  # the next step applies them to the index
    rows = dict(db.execute("SELECT key, state FROM blocks").fetchall())
    assert rows == {key(0): BlockState.PRESENT, key(1): BlockState.PRESENT,
                    key(2): BlockState.PRESENT}  # fmt: skip
    used = db.execute("SELECT value FROM meta WHERE name='used'").fetchone()[0]
    assert used == 3 * FILE
    assert second.lookup(key(1), CTX).name == "HIT"
    second.shutdown()
    db.close()


def test_a_new_store_on_a_full_disk_is_refused_naming_the_volume_and_the_fix(small_fs):
    from tools.crash_campaign.disk_full import DiskFiller
    from vllm_uma.kv_offload.disk.ledger.db import LedgerError

    DiskFiller(small_fs / "filler").set_full(True)
    with pytest.raises(LedgerError, match=r"is full: the shared ledger .* Free space"):
        make_tier(small_fs / "kv", Primary())
