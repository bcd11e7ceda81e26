"""The crash campaign's checker (tools/crash_campaign/invariants.py) shown to
catch each broken invariant, on a store a real tier wrote. The campaign
itself, its servers killed and tied to it: tests/integration/test_crash_campaign.py."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from disk_tier_kit import FILE, Jobs, Primary, block_files, key, make_tier

from tools.crash_campaign import invariants


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
