"""L3 disk tier leftovers of a crash, with other processes: a temp file of a
live writer is kept, a dead or stale one's removed. The other failure paths:
tests/unit/test_disk_tier_failures.py."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.unit.disk_tier_kit import NS, InfoLog, Jobs, Primary, key, make_tier
from vllm_uma.kv_offload.disk import block_file as bf


@pytest.fixture
def primary():
    return Primary()


def path_of(root, k: bytes, ns: bytes = NS):
    return bf.block_path(root / ".noindex" / ns.hex(), k)


def test_a_live_writers_temp_file_is_kept_a_dead_or_stale_ones_removed(tmp_path, primary):
    """A server starting while another still writes (a restart while the old
    one drains, or two servers on one root) must not delete its writes."""
    tier = make_tier(tmp_path, primary)
    Jobs(tier).stored([key(0)], [0])
    tier.shutdown()
    block = path_of(tmp_path, key(0))
    sleeper = subprocess.Popen(["sleep", "60"])  # a live process, not us
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        live = block.with_name(f"{block.name}.{sleeper.pid}-0123456789ab.tmp")
        gone = block.with_name(f"{block.name}.{dead.pid}-0123456789ab.tmp")
        stale = block.with_name(f"{block.name}.{sleeper.pid}-ba9876543210.tmp")
        for temp in (live, gone, stale):
            temp.write_bytes(b"a write")
        two_hours_ago = time.time() - 7200
        os.utime(stale, (two_hours_ago, two_hours_ago))
        with InfoLog() as log:
            tier = make_tier(tmp_path, primary)
        assert live.exists()
        assert not gone.exists() and not stale.exists()
        # Only what was removed is counted as removed.
        assert any("2 leftover temp files removed" in m for m in log.messages), log.messages
        tier.shutdown()
    finally:
        sleeper.kill()
        sleeper.wait()
