"""The crash campaign (tools/crash_campaign/): CI's short run, its checker
shown to catch each broken invariant, and its servers tied to it."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from disk_tier_kit import FILE, Jobs, Primary, block_files, key, make_tier

from tools.crash_campaign import invariants
from tools.crash_campaign.driver import Campaign

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_campaign_breaks_no_invariant(tmp_path):
    """CI's run: three servers, at least 24 kills, a check after each."""
    store, logs = tmp_path / "store", tmp_path / "logs"
    store.mkdir(mode=0o700)
    logs.mkdir()
    campaign = Campaign(store, logs, servers=3, cap_blocks=64, seed=7, traffic_s=0.2)
    tally = campaign.run(24)
    log = (logs / "servers.log").read_text()
    assert tally.violations == [], "\n".join(tally.violations) + "\n" + log[-3000:]
    assert tally.kills >= 24 and tally.rounds >= 1
    assert tally.startup_kills >= 1  # some kills landed before a server was ready
    assert "stopped: {" in log  # the clean stop drained each server, with traffic done
    restored = sum(int(n) for n in re.findall(r"'restored': (\d+)", log))
    assert restored > 0, log[-2000:]


def test_a_campaign_on_a_full_disk_breaks_no_invariant(tmp_path):
    """Half the rounds with the store's file system full to its last byte,
    start-ups included (tools/crash_campaign/disk_full.py)."""
    from tools.crash_campaign.disk_full import SmallFsError, mount_small_fs, unmount

    mount = tmp_path / "fs"
    mount.mkdir()
    try:
        mount_small_fs(mount, 32 << 20)
    except SmallFsError as exc:
        pytest.skip(str(exc))
    try:
        store, logs = mount / "store", tmp_path / "logs"
        store.mkdir(mode=0o700)
        logs.mkdir()
        campaign = Campaign(
            store, logs, servers=3, cap_blocks=64, seed=1, traffic_s=0.5,
            filler=mount / "filler", full_share=0.5,
        )  # fmt: skip
        tally = campaign.run(40)
        log = (logs / "servers.log").read_text()
        assert tally.violations == [], "\n".join(tally.violations) + "\n" + log[-3000:]
        assert tally.full_rounds >= 5
        assert "is full" in log  # the disk was full where the servers wrote
    finally:
        unmount(mount)


@pytest.fixture
def store(tmp_path):
    """A store of 4 blocks, written by a real tier that then stopped."""
    primary = Primary()
    tier = make_tier(tmp_path, primary, cap_blocks=8)
    for row in range(4):
        primary.fill(row, seed=row + 1)
    assert Jobs(tier).stored([key(i) for i in range(4)], [0, 1, 2, 3]).success
    tier.shutdown()
    return tmp_path


def check(root: Path, **kw) -> list[str]:
    return invariants.check_store(
        root, cap_bytes=8 * FILE, file_bytes=FILE, live_pids=kw.pop("live", ()), io_threads=2, **kw
    )


def test_a_sound_store_passes_strictly(store):
    assert check(store, strict=True) == []


def _delete_a_file(root: Path) -> None:
    block_files(root)[0].unlink()


def _flip_a_payload_byte(root: Path) -> None:
    path = block_files(root)[0]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(data)


def _plant_a_file_without_row(root: Path) -> None:
    first = block_files(root)[0]
    twin = first.with_name("ff" * 36 + ".kvb")
    os.link(first, twin)


def _leave_a_dead_writers_temp(root: Path) -> None:
    first = block_files(root)[0]
    (first.parent / f"{first.name}.999999999-abcdef.tmp").write_bytes(b"x" * 100)


def _miscount_used(root: Path) -> None:
    db = sqlite3.connect(root / ".noindex" / "ledger.sqlite3")
    db.execute("UPDATE meta SET value=value+1 WHERE name='used'")
    db.commit()
    db.close()


def _leave_a_dead_writers_row(root: Path) -> None:
    db = sqlite3.connect(root / ".noindex" / "ledger.sqlite3")
    db.execute(
        "UPDATE blocks SET state=0, writer_pid=999999999 WHERE key=(SELECT min(key) FROM blocks)"
    )
    db.commit()
    db.close()


@pytest.mark.parametrize(
    "damage, said",
    [
        (_delete_a_file, "has no file"),
        (_flip_a_payload_byte, "kv-store verify"),
        (_plant_a_file_without_row, "has no ledger row"),
        (_leave_a_dead_writers_temp, "outlived its writer"),
        (_miscount_used, "ledger totals"),
        (_leave_a_dead_writers_row, "left WRITING by dead pid"),
    ],
)
def test_the_checker_catches_each_broken_invariant(store, damage, said):
    damage(store)
    found = check(store)
    assert any(said in line for line in found), found


def test_the_cap_counts_every_file_on_disk(store):
    """Over cap + one block per I/O thread of each live server: caught."""
    found = invariants.check_store(
        store, cap_bytes=2 * FILE, file_bytes=FILE, live_pids=(), io_threads=2
    )
    assert any("over the cap" in line for line in found)  # 4 blocks, a cap of 2
    assert any("over cap + writes in flight" in line for line in found)


def test_a_killed_campaign_leaves_no_server_behind_even_a_frozen_one(tmp_path):
    command = [sys.executable, "-m", "tools.crash_campaign", "--kills", "100000"]
    driver = subprocess.Popen(
        [*command, "--root", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        assert "crash campaign:" in driver.stdout.readline()
        deadline = time.monotonic() + 60
        while len(psutil.Process(driver.pid).children()) < 3:
            assert time.monotonic() < deadline, "the campaign started no servers"
            time.sleep(0.1)
        servers = psutil.Process(driver.pid).children()
        # One frozen, as the driver's check freezes them: it runs no thread,
        # so only the kernel's parent-death signal can end it.
        servers[0].suspend()
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 30
    while (alive := [s for s in servers if _running(s)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for server in alive:
        server.kill()
    assert alive == [], f"{len(alive)} servers outlived the killed campaign"


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (an orphan waits as one for its reaper, which
    may be this test process: another test made it a subreaper)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
