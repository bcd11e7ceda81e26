"""L3 shared ledger (disk/ledger/) across processes: a write a dead process
abandoned is reclaimed, and three forked processes keep one cap. In one
process: tests/unit/test_disk_ledger.py."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.ledger_kit import NS, Unlinks, never, ref
from vllm_uma.kv_offload.disk.layout import BlockRef
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path)
    led.create()
    yield led
    led.close()


def test_a_write_abandoned_by_a_dead_process_is_reclaimed_when_room_is_short(ledger):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    ledger.reserve(ref(0), 10, 100, None, "gone", never, Unlinks())
    db = sqlite3.connect(ledger.path)
    db.execute("UPDATE blocks SET writer_pid=?", (int(dead.stdout),))
    db.commit()
    db.close()
    unlinks = Unlinks()
    # Not a present block (the index never had it), but its name is
    # unlinked: a writer killed between the rename and the commit left a
    # complete file there, which would otherwise stay on disk uncounted.
    assert ledger.reserve(ref(1), 10, 200, 10, "w1", never, unlinks) == []
    assert unlinks == [ref(0)] and ledger.used_bytes() == 10
    db = sqlite3.connect(ledger.path)
    assert [k for (k,) in db.execute("SELECT key FROM blocks")] == [ref(1).key]
    db.close()


def _worker(root: str, writer: str, first: int, count: int, cap: int, size: int) -> None:
    """One "server": stores ``count`` blocks, each a real file of ``size``."""
    led = Ledger(Path(root))
    led.create()
    for i in range(first, first + count):
        r = ref(i)
        stamp = time.time_ns()

        def unlink(v: BlockRef) -> None:
            os.unlink(os.path.join(root, v.key.hex()))

        got = led.reserve(r, size, stamp, cap, writer, never, unlink)
        if isinstance(got, list):
            tmp = os.path.join(root, f"{r.key.hex()}.{writer}.tmp")
            with open(tmp, "wb") as f:
                f.write(b"x" * size)
            os.rename(tmp, os.path.join(root, r.key.hex()))
            led.commit(r, size, stamp, writer)
    led.close()


def _bytes_of_blocks(root: Path) -> int:
    total = 0
    for entry in os.scandir(root):
        if not entry.name.startswith("ledger"):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # renamed or unlinked meanwhile
                pass
    return total


def test_three_processes_keep_one_cap_and_the_ledger_matches_the_files(tmp_path):
    size, cap, per = 4096, 10 * 4096, 150
    # Forked, not spawned: a spawned child re-imports this module and the
    # tier (about 8 s each here) before its first store.
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_worker, args=(str(tmp_path), f"s{n}", n * 1000, per, cap, size))
        for n in range(3)
    ]
    for p in procs:
        p.start()
    peak = 0
    while any(p.is_alive() for p in procs):
        peak = max(peak, _bytes_of_blocks(tmp_path))
        time.sleep(0.001)
    assert all(p.join() is None and p.exitcode == 0 for p in procs)
    # Each process has at most one write in flight beyond the cap.
    assert peak <= cap + 3 * size, peak
    led = Ledger(tmp_path)
    names = {e.name for e in os.scandir(tmp_path) if not e.name.startswith("ledger")}
    present, _ = led.snapshot(NS)
    assert {k.hex() for k, _ in present} == names and len(names) == 10
    assert led.used_bytes() == cap
    led.close()
