"""The crash campaign (tools/crash_campaign/): CI's short run, one on a full
disk, and its servers tied to it. Its checker shown to catch each broken
invariant: tests/unit/test_crash_campaign_checker.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

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
