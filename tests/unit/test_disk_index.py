"""L3 disk index (vllm_uma/kv_offload/disk/index.py): this server's mirror."""

from __future__ import annotations

import pytest

from vllm_uma.kv_offload.disk.index import BlockState, DiskIndex


def test_a_store_is_a_miss_until_committed_and_gone_if_aborted():
    index = DiskIndex()
    index.begin_store("a", 10)
    assert index.state("a") is BlockState.WRITING and not index.is_present("a")
    index.commit("a")
    assert index.is_present("a")
    index.begin_store("b", 10)
    index.abort("b")
    assert "b" not in index and list(index) == ["a"]


def test_commit_and_abort_need_a_store_in_flight():
    index = DiskIndex()
    index.add_present("a", 10)
    with pytest.raises(KeyError):
        index.commit("a")
    with pytest.raises(KeyError):
        index.abort("nope")


def test_a_peer_block_is_added_once():
    index = DiskIndex()
    assert index.add_present("a", 10) is True
    assert index.add_present("a", 10) is False
    index.begin_store("b", 10)
    assert index.add_present("b", 10) is False  # ours is in flight: it stays ours
    assert index.state("b") is BlockState.WRITING


def test_pins_are_visible_to_the_io_threads_until_the_last_unpin():
    index = DiskIndex()
    index.add_present("a", 10)
    first, second = index.pin("a"), index.pin("a")
    assert "a" in index.pinned
    index.unpin("a", first)
    assert "a" in index.pinned
    index.unpin("a", second)
    assert "a" not in index.pinned


def test_only_present_blocks_can_be_pinned():
    index = DiskIndex()
    index.begin_store("w", 10)
    assert index.pin("w") is None and index.pin("missing") is None


def test_remove_and_unpin_of_an_older_generation_leave_the_newer_one():
    index = DiskIndex()
    index.add_present("a", 10)
    old = index.pin("a")
    assert index.remove("a") == 10 and "a" not in index.pinned  # a peer evicted it
    index.begin_store("a", 10)
    index.commit("a")
    index.unpin("a", old)  # the old load ends: the new block is untouched
    assert index.remove("a", old) is None and index.is_present("a")
    assert index.remove("a") == 10
