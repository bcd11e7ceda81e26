"""L3 disk index (vllm_uma/kv_offload/disk/index.py): LRU order, cap, pins."""

from __future__ import annotations

import pytest

from vllm_uma.kv_offload.disk.index import BlockState, DiskIndex, Refusal


def stored(index: DiskIndex, *names: str, size: int = 10) -> None:
    for name in names:
        assert index.reserve(name, size) == []
        index.commit(name)


def test_victims_are_least_recently_stored_or_restored_first():
    index = DiskIndex(cap_bytes=40)
    stored(index, "a", "b", "c", "d")
    index.touch("a")  # restored: goes last
    assert list(index) == ["b", "c", "d", "a"]
    assert index.reserve("e", 20) == [("b", 10), ("c", 10)]
    assert list(index) == ["d", "a", "e"]
    assert index.used_bytes == 40


def test_no_cap_never_evicts():
    index = DiskIndex(cap_bytes=None)
    stored(index, *"abcdefgh", size=1 << 40)
    assert len(index) == 8 and index.used_bytes == 8 << 40


def test_a_pinned_block_is_never_a_victim():
    index = DiskIndex(cap_bytes=30)
    stored(index, "a", "b", "c")
    serial = index.pin("a")
    assert serial is not None
    assert index.reserve("d", 10) == [("b", 10)]
    index.unpin("a", serial)
    assert index.reserve("e", 10) == [("a", 10)]


def test_a_block_being_written_is_never_a_victim():
    index = DiskIndex(cap_bytes=20)
    assert index.reserve("a", 10) == []  # not committed yet
    stored(index, "b")
    assert index.reserve("c", 10) == [("b", 10)]
    assert index.state("a") is BlockState.WRITING


def test_everything_pinned_is_a_refusal_that_changes_nothing():
    index = DiskIndex(cap_bytes=20)
    stored(index, "a", "b")
    index.pin("a")
    index.pin("b")
    assert index.reserve("c", 10) is Refusal.NO_ROOM
    assert list(index) == ["a", "b"] and index.used_bytes == 20
    assert "c" not in index


def test_not_enough_unpinned_room_is_a_refusal_that_evicts_nothing():
    index = DiskIndex(cap_bytes=30)
    stored(index, "a", "b", "c")
    index.pin("b")
    index.pin("c")
    assert index.reserve("d", 20) is Refusal.NO_ROOM
    assert list(index) == ["a", "b", "c"]


def test_a_block_bigger_than_the_cap_is_refused_without_evicting():
    index = DiskIndex(cap_bytes=25)
    stored(index, "a")
    assert index.reserve("big", 26) is Refusal.TOO_BIG
    assert list(index) == ["a"] and index.used_bytes == 10


def test_abort_releases_the_reserved_bytes():
    index = DiskIndex(cap_bytes=20)
    stored(index, "a")
    assert index.reserve("b", 10) == []
    index.abort("b")
    assert "b" not in index and index.used_bytes == 10
    assert index.reserve("c", 10) == []  # the room is there again, no eviction


def test_commit_and_abort_need_a_store_in_flight():
    index = DiskIndex(cap_bytes=None)
    stored(index, "a")
    with pytest.raises(KeyError, match="no store in flight"):
        index.commit("a")
    with pytest.raises(KeyError, match="no store in flight"):
        index.abort("zzz")


def test_only_present_blocks_can_be_pinned():
    index = DiskIndex(cap_bytes=None)
    index.reserve("w", 1)
    assert index.pin("w") is None
    assert index.pin("missing") is None
    assert not index.is_present("w")


def test_remove_and_unpin_of_an_older_generation_leave_the_newer_one():
    index = DiskIndex(cap_bytes=None)
    stored(index, "a")
    old = index.pin("a")
    assert index.remove("a", old) == 10  # the load found the file bad
    stored(index, "a")  # stored again meanwhile
    index.unpin("a", old)  # a late outcome of the old generation
    assert index.remove("a", old) is None
    assert index.is_present("a")
    new = index.pin("a")
    assert new != old and index.reserve("b", 1) == []


def test_files_found_at_startup_count_and_evict_oldest_first():
    index = DiskIndex(cap_bytes=25)
    for name in ["old", "mid", "new"]:  # mtime order
        index.add_existing(name, 10)
    assert index.used_bytes == 30
    assert index.evict_to_cap() == [("old", 10)]
    assert list(index) == ["mid", "new"] and index.used_bytes == 20


def test_cap_must_be_positive_or_none():
    with pytest.raises(ValueError, match="use None for no cap"):
        DiskIndex(cap_bytes=0)
