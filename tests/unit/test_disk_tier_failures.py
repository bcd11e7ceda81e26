"""L3 disk tier failure paths: bad block files, a full disk, write errors,
pins under eviction, leftovers of a crash. A bad block is never served and
never crashes the tier: vLLM sees a failed key and recomputes it. Temp
files of live and dead writers: tests/integration/test_disk_tier_failures_processes.py."""

from __future__ import annotations

import errno
import os
import shutil
import time

import pytest
from disk_tier_kit import (
    CTX,
    NS,
    OTHER_NS,
    ROW,
    Jobs,
    Primary,
    WarningLog,
    block_files,
    counters,
    held_io,
    key,
    make_tier,
    set_format_version,
)
from vllm.v1.kv_offload.base import LookupResult

from vllm_uma.kv_offload.disk import block_file as bf
from vllm_uma.kv_offload.disk import io_tasks, layout
from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk import tier as tier_module
from vllm_uma.kv_offload.disk.block_write import write_block
from vllm_uma.kv_offload.disk.io_descriptors import BlockIO, Shared
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger


@pytest.fixture
def primary():
    return Primary()


def path_of(root, k: bytes, ns: bytes = NS):
    return bf.block_path(root / ".noindex" / ns.hex(), k)


def truncate(root, primary):
    os.truncate(path_of(root, key(1)), 5000)


def flip_a_payload_byte(root, primary):
    with open(path_of(root, key(1)), "r+b") as f:
        f.seek(4096 + 100)
        byte = f.read(1)[0]
        f.seek(4096 + 100)
        f.write(bytes([byte ^ 0xFF]))


def copy_from_another_namespace(root, primary):
    theirs = path_of(root, key(1), OTHER_NS)
    theirs.parent.mkdir(parents=True)
    write_block(theirs, key(1), OTHER_NS, memoryview(primary.buffer)[:8192], direct=False)
    shutil.copy(theirs, path_of(root, key(1)))


def rename_another_key_onto_it(root, primary):
    os.rename(path_of(root, key(3)), path_of(root, key(1)))


def mark_a_format_version_not_read(root, primary):
    set_format_version(path_of(root, key(1)), 3)


def delete(root, primary):
    os.unlink(path_of(root, key(1)))


def plant_a_fifo(root, primary):
    # Without O_NONBLOCK, opening it would wait for a writer for ever.
    os.unlink(path_of(root, key(1)))
    os.mkfifo(path_of(root, key(1)), 0o600)


def plant_a_symlink_to_a_valid_block(root, primary):
    # A well-formed block file elsewhere (here: key 1's own bytes): the name
    # must not lead there, whatever it holds.
    outside = root.parent / f"{root.name}-outside.kvb"
    os.rename(path_of(root, key(1)), outside)
    os.symlink(outside, path_of(root, key(1)))


@pytest.mark.parametrize(
    "damage, reason",
    [
        (truncate, "truncated"),
        (flip_a_payload_byte, "corrupted"),
        (copy_from_another_namespace, "foreign"),
        (rename_another_key_onto_it, "foreign"),
        (mark_a_format_version_not_read, "foreign"),
        (delete, "missing"),
        (plant_a_fifo, "not_a_file"),
        (plant_a_symlink_to_a_valid_block, "not_a_file"),
    ],
)
def test_a_bad_block_is_never_served_but_removed_and_recomputed(tmp_path, primary, damage, reason):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    data = [primary.fill(row, seed=row + 1) for row in range(4)]
    assert jobs.stored([key(0), key(1), key(2), key(3)], [0, 1, 2, 3]).success
    tier.take_events()
    damage(tmp_path, primary)
    primary.clear()
    with WarningLog() as log:
        result = jobs.loaded([key(0), key(1), key(2)], [5, 6, 7])
    assert not result.success
    assert list(result.successful_keys) == [key(0), key(2)]  # vLLM recomputes key 1
    assert primary.row(5) == data[0] and primary.row(7) == data[2]
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    tier.drain_jobs()
    tier.get_finished_jobs()
    assert not path_of(tmp_path, key(1)).exists()
    assert counters(tier.get_stats())[(m.NAMES.bad_values, (reason,))] == 1
    assert [(e.keys, e.removed) for e in tier.take_events()] == [([key(1)], True)]
    assert len(log.messages) == 1 and reason in log.messages[0]
    tier.shutdown()


def test_the_same_kind_of_bad_block_is_logged_once(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    jobs.stored([key(0), key(1)], [0, 1])
    for k in (key(0), key(1)):
        os.truncate(path_of(tmp_path, k), 10)
    with WarningLog() as log:
        assert not jobs.loaded([key(0)], [4]).success
        assert not jobs.loaded([key(1)], [5]).success
    assert len(log.messages) == 1
    assert counters(tier.get_stats())[(m.NAMES.bad_values, ("truncated",))] == 2
    tier.shutdown()


def test_leftover_temp_files_are_deleted_at_startup(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    Jobs(tier).stored([key(0)], [0])
    tier.shutdown()
    block = path_of(tmp_path, key(0))
    leftovers = [
        block.with_name(block.name + ".0123456789ab.tmp"),  # a write cut short
        block.parent.parent / "namespace.json.abcdef012345.tmp",
        tmp_path / ".noindex" / OTHER_NS.hex() / "ab" / "ab.kvb.000000000000.tmp",
    ]
    for leftover in leftovers:
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_bytes(b"half a block")
    unrelated = tmp_path / ".noindex" / "notes.txt"
    unrelated.write_text("not ours to delete")
    tier = make_tier(tmp_path, primary)
    assert not any(leftover.exists() for leftover in leftovers)
    assert unrelated.exists() and block.exists()
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    tier.shutdown()


def test_a_file_with_a_name_no_key_makes_is_left_alone(tmp_path, primary):
    # A key longer than block_path accepts: indexed, its eviction would raise
    # in submit_store and the job would never end.
    odd = path_of(tmp_path, key(0)).parent / f"{('00' * 121)}.kvb"
    odd.parent.mkdir(parents=True)
    odd.write_bytes(b"x" * 100)
    tier = make_tier(tmp_path, primary, cap_blocks=1)
    jobs = Jobs(tier)
    assert jobs.stored([key(1)], [1]).success
    assert jobs.stored([key(2)], [2]).success  # evicts key(1), not the odd file
    assert odd.exists()
    tier.shutdown()


def failing_write(monkeypatch, code: int) -> list:
    calls = []

    def write(path, *args, **kw):
        calls.append(path)
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(io_tasks, "write_block", write)
    return calls


def test_a_full_disk_stops_all_stores_with_one_warning_and_serving_goes_on(
    tmp_path, primary, monkeypatch
):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    data = primary.fill(0, seed=9)
    assert jobs.stored([key(0)], [0]).success
    calls = failing_write(monkeypatch, errno.ENOSPC)
    with WarningLog() as log:
        assert not jobs.stored([key(1), key(2)], [1, 2]).success
        attempts = len(calls)
        assert not jobs.stored([key(3)], [3]).success  # refused without trying
        assert not jobs.stored([key(4)], [4]).success
    assert attempts == 2 and len(calls) == 2
    assert len(log.messages) == 1
    assert str(tmp_path) in log.messages[0] and "max_size_gib" in log.messages[0]
    assert counters(tier.get_stats())[(m.NAMES.store_failed, ("disk_full",))] == 4
    assert tier.used_bytes == bf.file_bytes(8192)  # key 0 only
    primary.clear()
    assert jobs.loaded([key(0)], [7]).success and primary.row(7) == data
    assert len(block_files(tmp_path)) == 1
    tier.shutdown()


def test_other_write_errors_warn_once_per_kind_and_later_stores_still_try(
    tmp_path, primary, monkeypatch
):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    calls = failing_write(monkeypatch, errno.EIO)
    with WarningLog() as log:
        assert not jobs.stored([key(0)], [0]).success
        assert not jobs.stored([key(1)], [1]).success
        failing_write(monkeypatch, errno.EACCES)
        assert not jobs.stored([key(2)], [2]).success
    assert len(calls) == 2 and len(log.messages) == 2
    assert "EIO" in log.messages[0] and "EACCES" in log.messages[1]
    assert tier.used_bytes == 0 and len(tier._index) == 0  # reservations aborted
    monkeypatch.undo()
    assert jobs.stored([key(0)], [0]).success
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    tier.shutdown()


def test_a_block_being_loaded_is_never_evicted(tmp_path, primary, monkeypatch):
    tier = make_tier(tmp_path, primary, cap_blocks=2)
    jobs = Jobs(tier)
    data = primary.fill(0, seed=5)
    jobs.stored([key(0)], [0])
    jobs.stored([key(1)], [1])
    release = held_io(monkeypatch, "read_block")
    load = jobs.load([key(0)], [6])  # key 0 is the oldest, but pinned now
    assert jobs.stored([key(2)], [2]).success
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    release.set()
    assert jobs.wait(load)[0].success and primary.row(6) == data
    tier.shutdown()


def test_a_store_is_refused_when_everything_else_is_pinned(tmp_path, primary, monkeypatch):
    tier = make_tier(tmp_path, primary, cap_blocks=1)
    jobs = Jobs(tier)
    jobs.stored([key(0)], [0])
    release = held_io(monkeypatch, "read_block")
    load = jobs.load([key(0)], [6])
    assert not jobs.stored([key(1)], [1]).success
    assert counters(tier.get_stats())[(m.NAMES.store_failed, ("no_room",))] == 1
    release.set()
    assert jobs.wait(load)[0].success
    tier.drain_jobs()  # the restore's touch is in the ledger: no longer protected
    assert jobs.stored([key(1)], [1]).success  # unpinned: key 0 may go now
    tier.shutdown()


@pytest.mark.parametrize("damage", [delete, flip_a_payload_byte])
def test_a_bad_blocks_delete_spares_a_fresh_copy_a_peer_stored_meanwhile(
    tmp_path, primary, monkeypatch, damage
):
    """Between our load finding a block bad and our delete of it, a peer
    evicts that file and stores the block again: the fresh copy stays."""
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    fresh = primary.fill(1, seed=9)
    assert jobs.stored([key(1)], [1]).success
    damage(tmp_path, primary)
    ref = BlockRef(NS, key(1))
    real_delete = tier_module.delete_task

    def a_peer_stores_first(io):
        peer_ledger = Ledger(tmp_path / ".noindex")
        peer = Shared(Layout(tmp_path), peer_ledger, "peer-1", None, lambda r: False)
        peer.layout.open()
        try:
            # The peer's eviction of the bad file, then its store of the block.
            peer_ledger.forget([ref], "peer-1", peer.layout.unlink)
            row = memoryview(bytearray(fresh))
            assert io_tasks.store_task(BlockIO(99, ref, peer, row=row, stamp=time.time_ns())).ok
        finally:
            peer.layout.close()
            peer_ledger.close()
        return real_delete(io)

    monkeypatch.setattr(tier_module, "delete_task", a_peer_stores_first)
    with WarningLog():
        assert not jobs.loaded([key(1)], [5]).success
    tier.drain_jobs()
    tier.get_finished_jobs()
    assert path_of(tmp_path, key(1)).exists()
    tier.shutdown()
    again = make_tier(tmp_path, primary)  # the copy is a block for every server
    primary.clear()
    assert Jobs(again).loaded([key(1)], [5]).success and primary.row(5) == fresh
    again.shutdown()


def test_a_block_evicted_between_lookup_and_load_fails_that_key(tmp_path, primary):
    tier = make_tier(tmp_path, primary, cap_blocks=1)
    jobs = Jobs(tier)
    jobs.stored([key(0)], [0])
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    # Until the hit's touch is in the ledger, no store evicts the block ...
    assert not jobs.stored([key(1)], [1]).success
    tier.drain_jobs()
    # ... then one may (cap 1: it is the only candidate), before the load.
    assert jobs.stored([key(2)], [2]).success
    result = jobs.loaded([key(0)], [5])
    assert not result.success and result.successful_keys is None
    tier.shutdown()


def test_an_unexpected_error_on_an_io_thread_ends_the_job_and_keeps_the_file(
    tmp_path, primary, monkeypatch
):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    jobs.stored([key(0)], [0])

    def bug(*args, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(io_tasks, "read_block", bug)
    with WarningLog() as log:
        assert not jobs.loaded([key(0)], [5]).success
    # A bug of ours is not a bad file: the block stays, on disk and indexed.
    assert len(log.messages) == 1 and "RuntimeError('a bug')" in log.messages[0]
    assert (m.NAMES.bad_values, ("unreadable",)) not in counters(tier.get_stats())
    assert len(block_files(tmp_path)) == 1
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    tier.shutdown()


def test_a_full_disk_at_startup_only_costs_the_namespace_description(
    tmp_path, primary, monkeypatch
):
    def full(path, info, **where):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(layout, "write_private_json", full)
    with WarningLog() as log:
        tier = make_tier(tmp_path, primary)
    assert len(log.messages) == 1 and "namespace.json" in log.messages[0]
    assert Jobs(tier).stored([key(0)], [0]).success
    tier.shutdown()


def test_a_symlinked_subdirectory_is_never_followed(tmp_path, primary):
    root = tmp_path / "kv"
    tier = make_tier(root, primary)
    jobs = Jobs(tier)
    for row in range(2):
        primary.fill(row, seed=row + 1)
    assert jobs.stored([key(0), key(1)], [0, 1]).success
    # Someone moves the blocks' subdirectory out and links it back in.
    subdir = path_of(root, key(0)).parent
    outside = tmp_path / "elsewhere"
    os.rename(subdir, outside)
    os.symlink(outside, subdir)
    before = sorted((p.name, p.stat().st_size) for p in outside.iterdir())
    primary.clear()
    with WarningLog():
        loaded = jobs.loaded([key(0), key(1)], [4, 5])
        primary.fill(2, seed=3)
        stored = jobs.stored([key(2)], [2])
        tier.drain_jobs()
        tier.get_finished_jobs()
    assert not loaded.success and not loaded.successful_keys
    assert primary.row(4) == bytes(ROW)  # nothing read through the link
    assert not stored.success
    # Nothing outside was read into a row, written, or deleted.
    assert sorted((p.name, p.stat().st_size) for p in outside.iterdir()) == before
    assert counters(tier.get_stats())[(m.NAMES.bad_values, ("not_a_file",))] == 2
    tier.shutdown()


def test_a_process_error_on_a_load_keeps_the_file(tmp_path, primary, monkeypatch):
    """Out of descriptors is this process's trouble, not the file's."""
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    jobs.stored([key(0)], [0])

    def no_fds(*args, **kw):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(io_tasks, "read_block", no_fds)
    with WarningLog():
        assert not jobs.loaded([key(0)], [5]).success
    assert len(block_files(tmp_path)) == 1
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    tier.shutdown()


def test_an_other_spelling_of_a_namespace_is_not_indexed(tmp_path, primary):
    lettered = bytes.fromhex("ab" * 16)
    tier = make_tier(tmp_path, primary, ns=lettered)
    Jobs(tier).stored([key(0)], [0])
    tier.shutdown()
    lower = tmp_path / ".noindex" / lettered.hex()
    os.rename(lower, lower.with_name(lettered.hex().upper()))
    tier = make_tier(tmp_path, primary)
    assert tier.used_bytes == 0  # never evicted by a path that misses it
    tier.shutdown()


@pytest.mark.parametrize(
    "name, pid",
    [
        ("x.kvb.1234-0123456789ab.tmp", 1234),
        ("x.kvb.0123456789ab.tmp", None),  # an older format
        ("x.kvb.99999999999999999999-ab.tmp", None),  # not a pid
    ],
)
def test_writer_pid(name, pid):
    assert bf.writer_pid(name) == pid


def test_a_load_still_queued_past_its_deadline_is_a_miss_and_the_file_is_kept(
    tmp_path, primary, monkeypatch
):
    tier = make_tier(tmp_path, primary, io_threads=1, load_deadline_s=0.2)
    jobs = Jobs(tier)
    data = primary.fill(0, seed=1)
    primary.fill(1, seed=2)
    jobs.stored([key(0), key(1)], [0, 1])
    release = held_io(monkeypatch, "read_block")  # the only thread is stuck in a read
    stuck = jobs.load([key(0)], [4])
    queued = jobs.load([key(1)], [5])
    given_up = jobs.wait(queued, timeout=5)[0]
    assert not given_up.success and given_up.successful_keys is None
    assert counters(tier.get_stats())[(m.LOADS_GIVEN_UP, ())] == 1
    assert stuck not in jobs.results  # started: its row may still be written, so it waits
    release.set()
    assert jobs.wait(stuck)[0].success and primary.row(4) == data
    tier.drain_jobs()
    assert primary.row(5) == bytes(ROW)  # the given-up load never touched its row
    assert tier.lookup(key(1), CTX) is LookupResult.HIT  # its file is fine: kept
    tier.shutdown()
