"""L3 disk tier (vllm_uma/kv_offload/disk/tier.py): stores, loads, jobs, cap,
restarts, permissions, events and metrics, on a tiny primary tier.
Failure paths are in test_disk_tier_failures.py."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
from disk_tier_kit import (
    CTX,
    FILE,
    NS,
    OTHER_NS,
    InfoLog,
    Jobs,
    Primary,
    block_files,
    counters,
    held_io,
    key,
    make_tier,
    set_format_version,
)
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    RequestOffloadingContext,
)

from vllm_uma.kv_offload.disk import reports as m
from vllm_uma.kv_offload.disk.tier import DiskTier


@pytest.fixture
def primary():
    return Primary()


@pytest.mark.parametrize("aligned", [False, True], ids=["buffered", "o_direct"])
def test_store_then_restore_the_exact_bytes_into_other_rows(tmp_path, aligned):
    primary = Primary(aligned)
    tier = make_tier(tmp_path, primary)
    assert tier._store.direct is aligned  # ext4 and tmpfs >= 6.6 take O_DIRECT
    jobs = Jobs(tier)
    data = [primary.fill(row, seed=row + 1) for row in range(3)]
    assert jobs.stored([key(0), key(1), key(2)], [0, 1, 2]).success
    assert [tier.lookup(key(i), CTX) for i in range(4)] == [LookupResult.HIT] * 3 + [
        LookupResult.MISS
    ]
    primary.clear()
    result = jobs.loaded([key(2), key(0)], [7, 5])
    assert result.success and result.successful_keys is None
    assert result.transfer_bytes == 2 * 8192
    assert primary.row(7) == data[2] and primary.row(5) == data[0]
    tier.shutdown()


def test_a_stop_writes_every_store_queued_before_it(tmp_path, primary, monkeypatch):
    """Ctrl-C or SIGTERM while stores wait for an I/O thread: they are on
    disk when the tier has stopped, not dropped (the log says 0)."""
    release = held_io(monkeypatch, "write_block")
    tier = make_tier(tmp_path, primary, io_threads=1)
    jobs = Jobs(tier)
    for row in range(6):
        primary.fill(row, seed=row + 1)
        jobs.store([key(row)], [row])  # one in hand, five queued behind it
    threading.Timer(0.2, release.set).start()
    with InfoLog() as log:
        tier.shutdown()
    assert len(block_files(tmp_path)) == 6
    assert any("6 block(s) written" in line and "0 store(s)" in line for line in log.messages)


def test_a_block_still_being_written_is_a_miss(tmp_path, primary, monkeypatch):
    release = held_io(monkeypatch, "write_block")
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    job = jobs.store([key(0)], [0])
    assert tier.lookup(key(0), CTX) is LookupResult.MISS
    assert tier.has_pending_work()
    release.set()
    jobs.wait(job)
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    tier.shutdown()


def test_every_store_job_gets_exactly_one_result_even_when_all_keys_are_skipped(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    first = jobs.store([key(0), key(1)], [0, 1])
    again = jobs.store([key(0), key(1)], [2, 3])  # still being written: skipped
    empty = jobs.store([], [])
    results = jobs.wait(first, again, empty)
    assert all(r.success for r in results)
    present = jobs.stored([key(1)], [4])  # now present: skipped
    assert present.success and present.transfer_bytes == 0
    assert len(block_files(tmp_path)) == 2
    skipped = counters(tier.get_stats())
    assert (
        skipped[(m.NAMES.store_skipped, ("writing",))]
        + skipped[(m.NAMES.store_skipped, ("present",))]
        == 3
    )
    assert not tier.has_pending_work()
    tier.shutdown()


def test_drain_jobs_leaves_every_result_ready(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    ids = [jobs.store([key(i)], [i]) for i in range(6)]
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    assert sorted(r.job_id for r in results) == ids
    assert not tier.has_pending_work()
    tier.shutdown()


def test_cap_holds_under_three_times_its_traffic_and_evicts_oldest_first(tmp_path, primary):
    tier = make_tier(tmp_path, primary, cap_blocks=4)
    jobs = Jobs(tier)
    for i in range(12):  # 3 x the cap
        job = jobs.store([key(i)], [i % 8])
        # The ledger counts a victim until its file is unlinked: one store
        # in flight has evicted one block at most.
        assert tier.used_bytes <= 4 * FILE + FILE
        jobs.wait(job)
        on_disk = sum(p.stat().st_size for p in block_files(tmp_path))
        assert on_disk <= 4 * FILE + FILE
    tier.drain_jobs()
    tier.get_finished_jobs()
    assert [tier.lookup(key(i), CTX) for i in range(12)] == [LookupResult.MISS] * 8 + [
        LookupResult.HIT
    ] * 4
    assert len(block_files(tmp_path)) == 4
    assert counters(tier.get_stats())[(m.EVICTED_BLOCKS, ())] == 8
    tier.shutdown()


def test_a_restore_makes_a_block_recent_again(tmp_path, primary):
    tier = make_tier(tmp_path, primary, cap_blocks=3)
    jobs = Jobs(tier)
    for i in range(3):
        jobs.stored([key(i)], [i])
    assert jobs.loaded([key(0)], [5]).success  # 0 is now the most recent
    jobs.stored([key(3)], [3])
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    assert tier.lookup(key(0), CTX) is LookupResult.HIT
    tier.shutdown()


def test_restart_finds_earlier_blocks_in_their_lru_order(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    data = [primary.fill(i, seed=i + 3) for i in range(3)]
    for i in range(3):
        jobs.stored([key(i)], [i])
    # Stored an hour, then minutes apart (the kernel's file clock ticks every
    # few ms: blocks stored within one tick have equal mtimes).
    for i, path in enumerate(block_files(tmp_path)):
        os.utime(path, (1e9 + 60 * i, 1e9 + 60 * i))
    assert jobs.loaded([key(0)], [6]).success  # bumps key 0's mtime to now
    tier.shutdown()

    primary.clear()
    tier = make_tier(tmp_path, primary, cap_blocks=3)  # same root, a new process
    jobs = Jobs(tier)
    jobs.stored([key(9)], [1])  # one must go: key 1, the least recent on disk
    assert [tier.lookup(key(i), CTX) for i in (0, 1, 2, 9)] == [
        LookupResult.HIT,
        LookupResult.MISS,
        LookupResult.HIT,
        LookupResult.HIT,
    ]
    assert jobs.loaded([key(2)], [7]).success and primary.row(7) == data[2]
    tier.shutdown()


def test_a_store_of_format_version_1_files_is_restored_after_the_upgrade(tmp_path, primary):
    # Files a vllm-uma that checksummed with zlib.crc32 wrote: still served,
    # none counted bad; new stores are written in version 2.
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    data = [primary.fill(i, seed=i + 5) for i in range(2)]
    assert jobs.stored([key(0), key(1)], [0, 1]).success
    tier.shutdown()
    for path in block_files(tmp_path):
        set_format_version(path, 1)

    primary.clear()
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    assert jobs.loaded([key(0), key(1)], [6, 7]).success
    assert [primary.row(6), primary.row(7)] == data
    assert not any(name == m.NAMES.bad_values for name, _ in counters(tier.get_stats()))
    jobs.stored([key(2)], [2])
    versions = {p.name: p.read_bytes()[8:10] for p in block_files(tmp_path)}
    assert versions[key(2).hex() + ".kvb"] == b"\x02\x00"
    assert versions[key(0).hex() + ".kvb"] == b"\x01\x00"
    tier.shutdown()


def test_other_namespaces_count_toward_the_cap_but_are_never_served(tmp_path, primary):
    theirs = make_tier(tmp_path, primary, ns=OTHER_NS)
    Jobs(theirs).stored([key(0)], [0])  # the older of their two
    Jobs(theirs).stored([key(1)], [1])
    theirs.shutdown()

    tier = make_tier(tmp_path, primary, cap_blocks=3)
    jobs = Jobs(tier)
    assert tier.lookup(key(0), CTX) is LookupResult.MISS
    assert tier.used_bytes == 2 * FILE
    jobs.stored([key(5), key(6)], [2, 3])  # evicts one of theirs, oldest first
    tier.drain_jobs()
    tier.get_finished_jobs()
    assert len(block_files(tmp_path)) == 3
    assert not (tmp_path / ".noindex" / OTHER_NS.hex() / "00" / f"{key(0).hex()}.kvb").exists()
    tier.shutdown()


def test_an_over_cap_root_is_trimmed_at_startup(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    Jobs(tier).stored([key(i) for i in range(5)], list(range(5)))
    tier.shutdown()
    tier = make_tier(tmp_path, primary, cap_blocks=2)
    tier.drain_jobs()
    tier.get_finished_jobs()
    assert len(block_files(tmp_path)) == 2 and tier.used_bytes == 2 * FILE
    tier.shutdown()


def test_directories_are_private_and_files_owner_only(tmp_path, primary):
    noindex = tmp_path / ".noindex"
    noindex.mkdir(mode=0o755)
    os.chmod(noindex, 0o755)  # made wider by hand, or by an older version
    tier = make_tier(tmp_path, primary)
    Jobs(tier).stored([key(0)], [0])
    ns_dir = noindex / NS.hex()
    for directory in (noindex, ns_dir, ns_dir / key(0).hex()[:2]):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for file in [ns_dir / "namespace.json", *block_files(tmp_path)]:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert json.loads((ns_dir / "namespace.json").read_text())["model"] == "test-model"
    tier.shutdown()


def test_events_announce_our_stores_and_removals(tmp_path, primary):
    tier = make_tier(tmp_path, primary, cap_blocks=2)
    jobs = Jobs(tier)
    jobs.stored([key(0), key(1)], [0, 1])  # a prefix: its tail goes first
    jobs.stored([key(2)], [2])  # evicts key 1
    events = list(tier.take_events())
    assert [(e.keys, e.removed) for e in events] == [
        ([key(0), key(1)], False),
        ([key(1)], True),
        ([key(2)], False),
    ]
    assert {(e.medium, e.ownership) for e in events} == {(Medium.STORAGE, None)}
    assert list(tier.take_events()) == []
    tier.shutdown()


def test_a_restarted_tier_announces_the_blocks_it_found(tmp_path, primary):
    first = make_tier(tmp_path, primary)
    Jobs(first).stored([key(0), key(1)], [0, 1])
    first.shutdown()
    theirs = make_tier(tmp_path, primary, ns=OTHER_NS)  # another model's block
    Jobs(theirs).stored([key(7)], [2])
    theirs.shutdown()
    tier = make_tier(tmp_path, primary)
    events = list(tier.take_events())
    assert len(events) == 1 and not events[0].removed
    assert sorted(events[0].keys) == [key(0), key(1)]  # ours only
    assert events[0].medium == Medium.STORAGE
    tier.shutdown()


def test_no_events_when_they_are_off(tmp_path, primary):
    tier = make_tier(tmp_path, primary, events=False)
    Jobs(tier).stored([key(0)], [0])
    assert list(tier.take_events()) == []
    tier.shutdown()


def test_metrics_count_traffic_and_every_name_is_defined(tmp_path, primary):
    tier = make_tier(tmp_path, primary)
    jobs = Jobs(tier)
    jobs.stored([key(0), key(1)], [0, 1])
    tier.lookup(key(0), CTX)
    jobs.loaded([key(0)], [4])
    tier.drain_jobs()  # the used-bytes gauge comes with the ledger feed
    tier.get_finished_jobs()
    got = counters(tier.get_stats())
    assert got[(m.NAMES.written_blocks, ())] == 2 and got[(m.NAMES.written_bytes, ())] == 2 * 8192
    assert got[(m.NAMES.read_blocks, ())] == 1 and got[(m.NAMES.read_bytes, ())] == 8192
    assert got[(m.NAMES.lookup_hits, ())] == 1
    assert got[(m.USED_BYTES, ())] == 2 * FILE
    assert tier.get_stats() is None  # nothing new since the last call
    definitions = DiskTier.build_metric_definitions({})
    for name, labels in got:
        assert name.startswith("vllm:kv_offload_disk_")
        assert len(definitions[name].labelnames) == len(labels)
    assert isinstance(definitions[m.NAMES.written_blocks], OffloadingCounterMetadata)
    assert isinstance(definitions[m.USED_BYTES], OffloadingGaugeMetadata)
    tier.shutdown()


def test_manager_touch_and_request_context(tmp_path, primary):
    tier = make_tier(tmp_path, primary, cap_blocks=2)
    jobs = Jobs(tier)
    jobs.stored([key(0)], [0])
    jobs.stored([key(1)], [1])
    tier.touch([key(0)], CTX)  # an L1 hit on key 0
    jobs.stored([key(2)], [2])
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    assert tier.on_new_request(CTX) == RequestOffloadingContext()
    tier.shutdown()


def test_shutdown_lets_the_primary_close_its_mapping(tmp_path):
    primary = Primary(aligned=True)
    tier = make_tier(tmp_path, primary)
    Jobs(tier).store([key(i) for i in range(8)], list(range(8)))
    with InfoLog() as log:
        tier.shutdown()
        tier.shutdown()  # twice is harmless: one stop
    stops = [line for line in log.messages if line.startswith("Disk KV tier stopped")]
    assert len(stops) == 1 and stops[0].startswith("Disk KV tier stopped: 8 block(s) written")
    assert len(block_files(tmp_path)) == 8  # the queued stores were written first
    primary.view.release()
    primary.buffer.close()  # raises BufferError if a view of it were left


def test_two_servers_on_one_root_find_each_others_blocks_under_one_cap(tmp_path):
    a_rows, b_rows = Primary(), Primary()
    a = make_tier(tmp_path, a_rows, cap_blocks=3)
    b = make_tier(tmp_path, b_rows, cap_blocks=3)
    data = a_rows.fill(0, seed=9)
    for i in range(3):
        Jobs(a).stored([key(i)], [i])
    b.drain_jobs()  # the feed brings a's stores
    b.get_finished_jobs()
    assert b.lookup(key(0), CTX) is LookupResult.HIT
    assert Jobs(b).loaded([key(0)], [5]).success and b_rows.row(5) == data
    stored_by_b = [e.keys for e in b.take_events() if not e.removed]
    assert stored_by_b == [[key(0)], [key(1)], [key(2)]]  # announced: restorable here

    b.drain_jobs()  # b's restore of key 0 is in the ledger: key 1 is the oldest now
    Jobs(b).stored([key(3)], [3])
    assert b.used_bytes == 3 * FILE and len(block_files(tmp_path)) == 3
    a.drain_jobs()
    a.get_finished_jobs()
    assert a.lookup(key(1), CTX) is LookupResult.MISS  # evicted by b: a clean miss
    assert [e.keys for e in a.take_events() if e.removed] == [[key(1)]]
    assert a.lookup(key(3), CTX) is LookupResult.HIT
    got = counters(a.get_stats())
    assert got[(m.PEER_CHANGES, ("added",))] == 1 and got[(m.PEER_CHANGES, ("removed",))] == 1
    a.shutdown()
    b.shutdown()


def test_reading_a_large_store_reports_progress(tmp_path, primary, monkeypatch):
    from disk_tier_kit import InfoLog

    from vllm_uma.kv_offload.disk import progress

    tier = make_tier(tmp_path, primary)
    Jobs(tier).stored([key(0)], [0])
    Jobs(tier).stored([key(1)], [1])  # both in subdirectory "00": one step of 2
    tier.shutdown()
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)
    with InfoLog(progress.logger) as log:
        make_tier(tmp_path, primary).shutdown()
    lines = log.messages
    assert any(line.startswith("Disk KV tier: reading the store: 2 block files") for line in lines)
