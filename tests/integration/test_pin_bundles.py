"""A pin carried between stores (pins/bundle*.py) through ``vllm-uma kv-store
ROOT export|import``: real block files written by the real disk tier, the
real ledger, no vLLM server. The manifest's parsing alone:
tests/unit/test_pin_bundle_manifest.py."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.disk_tier_kit import FILE, NS, OTHER_NS, Jobs, Primary, key, make_tier
from tests.unit.pins_bundle_kit import state
from vllm_uma.commands import main as cli
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.pins import book

KEYS = [key(k) for k in range(4)]
MODEL = "test-model"  # disk_tier_kit's namespace info


def a_store(root: Path, primary: Primary, ns: bytes = NS, stored: int = 0) -> None:
    """A store as a server leaves it: its namespace, ledger and ``stored``
    blocks of KEYS (the rows seeded by key)."""
    tier = make_tier(root, primary, ns=ns)
    for row in range(stored):
        primary.fill(row, seed=row + 1)
    if stored:
        assert Jobs(tier).stored(KEYS[:stored], list(range(stored))).success
    tier.shutdown()


def pin(root: Path, name: str = "system", ttl_s: float | None = 3600.0) -> None:
    ledger = Ledger(root / ".noindex")
    book.pin(
        ledger, NS, name, KEYS, block_bytes=FILE, tokens=16 * len(KEYS), ttl_s=ttl_s,
        budget=book.PinBudget(0.5, None),
    )  # fmt: skip
    ledger.close()


@pytest.fixture
def primary():
    return Primary()


@pytest.fixture
def source(tmp_path, primary):
    root = tmp_path / "a"
    a_store(root, primary, stored=len(KEYS))
    pin(root)
    return root


@pytest.fixture
def target(tmp_path, primary):
    """Another host's store: a server of the same model ran on it once."""
    root = tmp_path / "b"
    a_store(root, primary)
    return root


def run(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main(["kv-store", *map(str, argv)])
    out = capsys.readouterr()
    return status, out.out, out.err


def block_path(root: Path, k: bytes, ns: bytes = NS) -> Path:
    return Layout(root).path(BlockRef(ns, k))


def exported(capsys, source: Path, out: Path) -> dict:
    status, stdout, err = run(capsys, source, "export", "system", out)
    assert status == 0, err
    return json.loads((out / "manifest.json").read_text())


def test_round_trip_byte_identical_blocks_a_running_server_finds(
    source, target, primary, tmp_path, capsys
):
    bundle = tmp_path / "bundle"
    status, out, err = run(capsys, source, "export", "system", bundle)
    assert status == 0, err
    assert "4 of its 4 blocks" in out and "only a prefix" not in out
    assert not (tmp_path / "bundle.partial").exists()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["namespace"] == {
        "id": NS.hex(),
        "info": {"model": MODEL, "kv_dtype": "bfloat16"},
    }
    assert [b["key"] for b in manifest["blocks"]] == [k.hex() for k in KEYS]
    assert 3500 < manifest["pin"]["ttl_s"] <= 3600
    for k in KEYS:
        assert (bundle / "blocks" / f"{k.hex()}.kvb").read_bytes() == block_path(
            source, k
        ).read_bytes()

    # A server of the model runs on the target while the import lands.
    tier = make_tier(target, primary, ns=NS)
    try:
        status, out, err = run(capsys, target, "import", bundle)
        assert status == 0, err
        assert "4 blocks written, 0 already in the store, 4 of its 4 blocks on disk" in out
        for k in KEYS:
            assert block_path(target, k).read_bytes() == block_path(source, k).read_bytes()
        ledger = Ledger(target / ".noindex")
        (made,) = book.pins(ledger)
        assert (made.name, made.blocks, made.blocks_on_disk, made.block_bytes) == (
            "system", 4, 4, FILE,
        )  # fmt: skip
        assert 3500 < made.expires - time.time() <= 3600
        assert ledger.used_bytes() == 4 * FILE
        ledger.close()
        deadline = time.monotonic() + 10
        while not all(tier.holds(k) for k in KEYS):  # the feed thread brings the commits
            assert time.monotonic() < deadline, "the running tier never saw the imported blocks"
            list(tier.get_finished_jobs())
            time.sleep(0.05)
        expected = [primary.row(r) for r in range(4)]
        primary.clear()
        assert Jobs(tier).loaded(KEYS, [0, 1, 2, 3]).success
        assert [primary.row(r) for r in range(4)] == expected
    finally:
        tier.shutdown()


def test_a_flipped_byte_is_refused_and_nothing_is_written(source, target, tmp_path, capsys):
    bundle = tmp_path / "bundle"
    exported(capsys, source, bundle)
    victim = bundle / "blocks" / f"{KEYS[2].hex()}.kvb"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(data)
    before = state(target)
    status, _, err = run(capsys, target, "import", bundle)
    assert status == 2
    assert f"block file {victim} does not match the manifest" in err
    assert state(target) == before
    # The manifest's sha256 made to agree: the store's own header check
    # (the payload's CRC-32C) still refuses it.
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["blocks"][2]["sha256"] = hashlib.sha256(data).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    status, _, err = run(capsys, target, "import", bundle)
    assert status == 2 and "corrupted: payload checksum mismatch" in err
    assert state(target) == before


def test_a_bundle_of_another_namespace_is_refused_with_the_reason(
    source, primary, tmp_path, capsys
):
    other = tmp_path / "other"
    a_store(other, primary, ns=OTHER_NS)  # a server of another model ran here
    bundle = tmp_path / "bundle"
    exported(capsys, source, bundle)
    before = state(other)
    status, _, err = run(capsys, other, "import", bundle)
    assert status == 2
    assert f"bundle of model '{MODEL}' (namespace {NS.hex()}) refused, nothing written" in err
    assert f"it has {OTHER_NS.hex()} ({MODEL})" in err
    assert f"Start a server of '{MODEL}'" in err and "import into a store of that model" in err
    assert state(other) == before
    # A manifest rewritten to claim the namespace this store knows: the
    # block files' headers still say whose KV they are.
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["namespace"]["id"] = OTHER_NS.hex()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    status, _, err = run(capsys, other, "import", bundle)
    assert status == 2 and f"foreign: namespace {NS.hex()}" in err
    assert state(other) == before


def test_an_export_never_writes_into_an_existing_directory(source, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    status, _, err = run(capsys, source, "export", "system", out)
    assert status == 2 and f"{out} exists" in err
    assert list(out.iterdir()) == [] and not (tmp_path / "taken.partial").exists()
    # A crashed export's leftover is refused too, with the fix.
    (tmp_path / "next.partial").mkdir()
    status, _, err = run(capsys, source, "export", "system", tmp_path / "next")
    assert status == 2 and "remove it once none runs" in err
    assert not (tmp_path / "next").exists()


def test_a_pin_with_a_missing_block_exports_its_present_prefix(source, target, tmp_path, capsys):
    block_path(source, KEYS[2]).unlink()  # evicted, or deleted by hand
    bundle = tmp_path / "bundle"
    status, out, err = run(capsys, source, "export", "system", bundle)
    assert status == 0, err
    assert "2 of its 4 blocks" in out and "stops where the disk does, at block 2 of 4" in out
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert len(manifest["blocks"]) == 2 and len(manifest["pin"]["keys"]) == 4
    assert sorted(p.name for p in (bundle / "blocks").iterdir()) == [
        f"{k.hex()}.kvb" for k in KEYS[:2]
    ]
    status, out, err = run(capsys, target, "import", bundle, "--ttl-s", 60)
    assert status == 0, err
    assert "2 blocks written" in out and "2 of its 4 blocks on disk" in out
    ledger = Ledger(target / ".noindex")
    (made,) = book.pins(ledger)
    assert made.blocks == 4 and 50 < made.expires - time.time() <= 60
    ledger.close()
    assert not block_path(target, KEYS[2]).exists()


def test_an_io_error_mid_import_leaves_whole_blocks_only(
    source, target, tmp_path, capsys, monkeypatch
):
    bundle = tmp_path / "bundle"
    exported(capsys, source, bundle)
    real_fsync, calls = os.fsync, []

    def failing(fd):
        calls.append(fd)
        if len(calls) == 3:  # block 1's file (block 0: its file and its directory)
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    status, _, err = run(capsys, target, "import", bundle)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert status == 2
    assert "import stopped at block 1" in err and "1 of 4 blocks are in the store" in err
    assert block_path(target, KEYS[0]).read_bytes() == block_path(source, KEYS[0]).read_bytes()
    assert not list((target / ".noindex").rglob("*.tmp"))
    db = sqlite3.connect(target / ".noindex" / "ledger.sqlite3")
    assert db.execute("SELECT key, state FROM blocks").fetchall() == [(KEYS[0], 1)]
    db.close()
    status, out, err = run(capsys, target, "import", bundle)  # again: finishes
    assert status == 0 and "3 blocks written, 1 already in the store" in out


_KILLED_IMPORT = """
import os, signal, sys
from vllm_uma.commands import main as cli
real, calls = os.fsync, []
def fsync(fd):
    calls.append(fd)
    if len(calls) == 3:  # block 1's temp file written, not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)
    real(fd)
os.fsync = fsync
cli.main(["kv-store", sys.argv[1], "import", sys.argv[2]])
"""


def test_a_killed_import_leaves_a_temp_file_that_a_server_start_up_clears(
    source, target, primary, tmp_path, capsys
):
    bundle = tmp_path / "bundle"
    exported(capsys, source, bundle)
    repo = Path(__file__).resolve().parents[2]
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_IMPORT, str(target), str(bundle)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
    )
    assert killed.returncode == -9, killed.stderr
    temps = list((target / ".noindex").rglob("*.tmp"))
    assert len(temps) == 1 and temps[0].name.startswith(KEYS[1].hex() + ".kvb.")
    assert not block_path(target, KEYS[1]).exists()  # never half a block under its name
    db = sqlite3.connect(target / ".noindex" / "ledger.sqlite3")
    rows = dict(db.execute("SELECT key, state FROM blocks").fetchall())
    db.close()
    assert rows == {KEYS[0]: 1, KEYS[1]: 0}  # block 1 reserved (WRITING), never present
    a_store(target, primary)  # a server starts: the dead import's leftovers go
    assert not list((target / ".noindex").rglob("*.tmp"))
    status, out, err = run(capsys, target, "import", bundle)
    assert status == 0, err
    assert "3 blocks written, 1 already in the store, 4 of its 4 blocks on disk" in out
