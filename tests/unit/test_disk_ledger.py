"""L3 shared ledger (disk/ledger/): one cap, one LRU
order and one change feed for every server on a store. A dead process's
write and three processes on one cap: tests/integration/test_disk_ledger_processes.py."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tests.unit.ledger_kit import NS, Unlinks, never, ref
from vllm_uma.kv_offload.disk.index import BlockState
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.db import LedgerError
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.disk.ledger.startup import open_ledger, reconcile
from vllm_uma.kv_offload.disk.reports import DiskWarnings
from vllm_uma.kv_offload.disk.store_scan import FoundBlock

OTHER = b"\x22" * 16


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path)
    led.create()
    yield led
    led.close()


def stored(led: Ledger, i: int, stamp: int, *, cap=None, writer="w1", ns=NS, unlink=None):
    got = led.reserve(
        ref(i, ns), 10, stamp, cap, writer, never, Unlinks() if unlink is None else unlink
    )
    assert isinstance(got, list), got
    led.commit(ref(i, ns), 10, stamp, writer)
    return got


def test_victims_are_the_least_recent_of_any_writer_and_namespace(ledger):
    stored(ledger, 0, 100, writer="a")
    stored(ledger, 1, 200, writer="b", ns=OTHER)
    stored(ledger, 2, 300, writer="a")
    ledger.touch({ref(0): 400})  # restored: most recent now
    unlinks = Unlinks()
    victims = stored(ledger, 3, 500, cap=30, writer="c", unlink=unlinks)
    assert victims == [(ref(1, OTHER), 10)] and unlinks == [ref(1, OTHER)]
    assert ledger.used_bytes() == 30


def test_a_touch_never_moves_a_block_back(ledger):
    stored(ledger, 0, 100)
    stored(ledger, 1, 200)
    ledger.touch({ref(1): 50})
    assert stored(ledger, 2, 300, cap=20) == [(ref(0), 10)]


def test_protected_blocks_are_skipped_and_all_protected_is_a_refusal(ledger):
    stored(ledger, 0, 100)
    stored(ledger, 1, 200)
    got = ledger.reserve(ref(2), 10, 300, 20, "w1", lambda r: r == ref(0), Unlinks())
    assert got == [(ref(1), 10)]
    ledger.commit(ref(2), 10, 300, "w1")
    assert ledger.reserve(ref(3), 10, 400, 20, "w1", lambda r: True, Unlinks()) is Refusal.NO_ROOM
    assert ledger.used_bytes() == 20  # nothing changed
    assert ledger.reserve(ref(3), 30, 400, 20, "w1", never, Unlinks()) is Refusal.TOO_BIG


def test_a_block_being_written_is_no_victim_and_its_name_is_taken(ledger):
    assert ledger.reserve(ref(0), 10, 100, 20, "w1", never, Unlinks()) == []
    assert ledger.reserve(ref(0), 10, 150, 20, "w2", never, Unlinks()) is BlockState.WRITING
    assert ledger.reserve(ref(1), 20, 200, 20, "w2", never, Unlinks()) is Refusal.NO_ROOM
    ledger.commit(ref(0), 10, 100, "w1")
    assert ledger.reserve(ref(0), 10, 300, 20, "w2", never, Unlinks()) is BlockState.PRESENT


def test_abort_releases_and_commit_announces_to_others_only(ledger):
    ledger.reserve(ref(0), 10, 100, None, "w1", never, Unlinks())
    ledger.abort(ref(0), "w1")
    assert ledger.used_bytes() == 0
    stored(ledger, 1, 200, writer="w1")
    ledger.forget([ref(1)], "w2", None)
    changes, gap = ledger.changes_since(0)
    assert not gap
    assert [(c.ref, c.added, c.writer) for c in changes] == [
        (ref(1), True, "w1"),
        (ref(1), False, "w2"),
    ]
    assert ledger.used_bytes() == 0


def test_a_reader_behind_the_pruned_changes_is_told_to_reload(ledger):
    for i in range(3):
        stored(ledger, i, 100 + i)
    assert ledger.changes_since(0)[1] is False
    ledger.prune_changes(older_than_s=-1)  # everything
    stored(ledger, 9, 900)
    assert ledger.changes_since(0)[1] is True  # changes 1..3 are gone
    assert ledger.changes_since(3)[1] is False
    present, seq = ledger.snapshot(NS)
    assert [k for k, _ in present] == [ref(i).key for i in (0, 1, 2, 9)] and seq == 4


def test_reconcile_takes_the_files_as_the_truth(tmp_path, ledger):
    layout = Layout(tmp_path)
    stored(ledger, 0, 100)  # its file is gone: forgotten
    found = [FoundBlock(ref(1), 10, 50), FoundBlock(ref(2), 10, 40)]  # unknown files: added
    done = reconcile(ledger, found, lambda r: r in (ref(1), ref(2)), "w9")
    assert (done.added, done.forgotten) == (2, 1)
    assert ledger.used_bytes() == 20
    present, _ = ledger.snapshot(NS)
    assert [k for k, _ in present] == [ref(2).key, ref(1).key]  # by mtime
    del layout


def test_a_file_a_peer_evicts_after_the_scan_gets_no_phantom_row(tmp_path, ledger):
    """The scan runs before reconcile's transaction: a block it saw that a
    peer evicts in between (row and file gone) must not come back."""
    files = tmp_path / "files"
    files.mkdir()

    def path(r: BlockRef) -> Path:
        return files / r.key.hex()

    for i in (0, 1):
        stored(ledger, i, 100 + i, writer="peer")
        path(ref(i)).write_bytes(b"x" * 10)
    found = [FoundBlock(ref(i), 10, 100 + i) for i in (0, 1)]  # what our scan saw
    peer = Ledger(tmp_path)
    try:  # the peer makes room for 10 bytes under a 10-byte cap: block 0 goes
        peer.evict_to_cap(10, "peer", never, lambda r: path(r).unlink())
    finally:
        peer.close()
    assert not path(ref(0)).exists()
    done = reconcile(ledger, found, lambda r: path(r).exists(), "w9")
    present, _ = ledger.snapshot(NS)
    assert [k for k, _ in present] == [ref(1).key]
    assert ledger.used_bytes() == 10 and done.added == 0


def test_a_damaged_ledger_is_set_aside_and_rebuilt(tmp_path):
    noindex = tmp_path / ".noindex"
    noindex.mkdir(mode=0o700)
    (noindex / "ledger.sqlite3").write_bytes(b"not a database" * 100)
    led = open_ledger(Layout(tmp_path), DiskWarnings(tmp_path))
    assert led.used_bytes() == 0
    assert len(list(noindex.glob("ledger.sqlite3.damaged-*"))) == 1
    led.close()


def test_a_planted_ledger_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", tmp_path / "ledger.sqlite3")
    with pytest.raises(LedgerError, match="not a regular file owned by this user"):
        Ledger(tmp_path).create()


def test_a_victim_keeps_its_name_and_bytes_until_its_file_is_gone(tmp_path, ledger):
    other = Ledger(tmp_path)  # another server's handle on the same store
    stored(ledger, 0, 100)
    seen = {}

    def unlink(victim: BlockRef) -> None:  # runs after the reservation's commit
        seen["reserve"] = other.reserve(victim, 10, 150, None, "w2", never, Unlinks())
        seen["used"] = other.used_bytes()
        seen["changes"] = [(c.ref, c.added) for c in other.changes_since(1)[0]]

    assert stored(ledger, 1, 200, cap=10, unlink=unlink) == [(ref(0), 10)]
    assert seen["reserve"] is BlockState.WRITING  # taken: no store lands under it
    assert seen["used"] == 20  # the victim's file still counts
    assert seen["changes"] == [(ref(0), False)]  # already announced as removed
    assert ledger.used_bytes() == 10
    assert other.reserve(ref(0), 10, 300, None, "w2", never, Unlinks()) == []  # free now
    other.close()


def test_a_deletion_left_by_a_dead_process_is_finished_or_undone_at_start(tmp_path, ledger):
    stored(ledger, 0, 100)
    stored(ledger, 1, 200)
    db = sqlite3.connect(ledger.path)
    db.execute(
        "UPDATE blocks SET state=?, writer_pid=999999999", (BlockState.DELETING,)
    )  # no such pid
    db.commit()
    db.close()
    # Block 0's file was not unlinked yet: a block again. Block 1's was.
    done = reconcile(ledger, [FoundBlock(ref(0), 10, 100)], lambda r: r == ref(0), "w9")
    assert done.reclaimed == 1
    present, _ = ledger.snapshot(NS)
    assert [k for k, _ in present] == [ref(0).key] and ledger.used_bytes() == 10


def test_concurrent_stores_do_not_evict_the_same_room_twice(tmp_path, ledger):
    other = Ledger(tmp_path)  # another I/O thread or server
    stored(ledger, 0, 100)
    stored(ledger, 1, 200)
    seen = {}

    def unlink(victim: BlockRef) -> None:  # block 0's file is still being deleted
        unlinks = Unlinks()
        seen["other"] = other.reserve(ref(3), 10, 350, 20, "w2", never, unlinks)
        seen["unlinked"] = list(unlinks)

    assert stored(ledger, 2, 300, cap=20, unlink=unlink) == [(ref(0), 10)]
    # Block 0's room is already being freed: the other store evicts block 1
    # alone (counting block 0 again, it would need two victims and find one).
    assert seen["other"] == [(ref(1), 10)] and seen["unlinked"] == [ref(1)]
    assert ledger.used_bytes() == 20
    other.close()


def test_a_failed_commit_leaves_the_connection_usable(ledger):
    db = ledger._conn()
    # A deferred foreign key fails at COMMIT, as a busy or full disk would.
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    db.execute(
        "CREATE TABLE child (pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)"
    )
    with pytest.raises(sqlite3.IntegrityError):
        with ledger.transaction() as tx:
            tx.execute("INSERT INTO child VALUES (42)")
    assert not db.in_transaction
    stored(ledger, 0, 100)  # the next transaction starts cleanly
    assert ledger.used_bytes() == 10


def test_block_states_keep_their_numbers_in_the_ledger(ledger):
    # The numbers are the ledger's on-disk format, shared by every server on
    # the store (an older one among them): renumbering would misread rows.
    assert [(s.name, int(s)) for s in BlockState] == [
        ("WRITING", 0),
        ("PRESENT", 1),
        ("DELETING", 2),
    ]
    assert ledger.reserve(ref(0), 10, 100, None, "w1", never, Unlinks()) == []
    with ledger.transaction() as db:
        assert db.execute("SELECT state FROM blocks").fetchall() == [(0,)]
    ledger.commit(ref(0), 10, 100, "w1")
    with ledger.transaction() as db:
        assert db.execute("SELECT state FROM blocks").fetchall() == [(1,)]
    assert ledger.snapshot(NS)[0] == [(ref(0).key, 10)]


def test_a_failed_release_of_victims_is_deferred_not_raised(tmp_path, monkeypatch):
    # Another server holds the ledger's write lock from the moment the
    # victims' files are unlinked: the second transaction, which releases
    # their rows, times out. The store keeps its reservation and learns its
    # victims (their files are gone); the release waits for retry_deferred.
    from vllm_uma.kv_offload.disk.ledger import db as ledger_db

    monkeypatch.setattr(ledger_db, "BUSY_TIMEOUT_S", 0.2)
    led = Ledger(tmp_path)
    led.create()
    stored(led, 0, 100)
    holder = sqlite3.connect(led.path, isolation_level=None)

    def unlink_then_lock(victim: BlockRef) -> None:
        holder.execute("BEGIN IMMEDIATE")

    got = led.reserve(ref(1), 10, 200, 10, "w1", never, unlink_then_lock)
    assert got == [(ref(0), 10)]
    states = dict(holder.execute("SELECT key, state FROM blocks").fetchall())
    assert states == {ref(0).key: BlockState.DELETING, ref(1).key: BlockState.WRITING}
    holder.execute("COMMIT")
    led.retry_deferred()
    led.commit(ref(1), 10, 200, "w1")
    assert dict(holder.execute("SELECT key, state FROM blocks").fetchall()) == {
        ref(1).key: BlockState.PRESENT
    }
    assert led.used_bytes() == 10
    holder.close()
    led.close()


def held_lock(path, seconds: float | None):
    """Another process's write transaction on the ledger, for ``seconds``
    (None: until the test ends it), from a thread."""
    import threading

    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    if seconds is not None:
        threading.Timer(seconds, lambda: holder.execute("COMMIT")).start()
    return holder


@pytest.fixture
def said(monkeypatch):
    """The disk tier's warnings, as logged."""
    from vllm_uma.kv_offload.disk import reports

    lines: list[str] = []
    monkeypatch.setattr(reports.logger, "warning", lambda fmt, *a: lines.append(fmt % a))
    return lines


def test_start_up_waits_for_a_peer_holding_the_ledger_past_the_busy_timeout(
    tmp_path, monkeypatch, said
):
    from vllm_uma.kv_offload.disk.ledger import db as ledger_db
    from vllm_uma.kv_offload.disk.ledger.startup import patiently

    monkeypatch.setattr(ledger_db, "BUSY_TIMEOUT_S", 0.2)
    led = Ledger(tmp_path)
    led.create()
    holder = held_lock(led.path, 1.5)  # a peer's long reconcile
    found = [FoundBlock(ref(0), 10, 100)]
    warnings = DiskWarnings(tmp_path)
    done = patiently(
        lambda: reconcile(led, found, lambda r: True, "w1"), "reconcile", led.path, warnings
    )
    assert done.added == 1 and led.used_bytes() == 10
    assert len(said) == 1  # said once, however many tries
    assert f"another process holds the shared ledger {led.path}" in said[0]
    assert "reconcile waits for it, up to 600 s" in said[0]
    holder.close()
    led.close()


def test_start_up_gives_up_after_its_deadline_naming_the_ledger(tmp_path, monkeypatch):
    from vllm_uma.kv_offload.disk.ledger import db as ledger_db
    from vllm_uma.kv_offload.disk.ledger import startup

    monkeypatch.setattr(ledger_db, "BUSY_TIMEOUT_S", 0.1)
    monkeypatch.setattr(startup, "STARTUP_WAIT_S", 0.5)
    led = Ledger(tmp_path)
    led.create()
    holder = held_lock(led.path, None)
    try:
        with pytest.raises(
            LedgerError, match=r"stayed locked for 0 s while this server's reconcile"
        ):
            startup.patiently(
                lambda: reconcile(led, [], lambda r: True, "w1"),
                "reconcile",
                led.path,
                DiskWarnings(tmp_path),
            )
    finally:
        holder.execute("COMMIT")
        holder.close()
        led.close()
