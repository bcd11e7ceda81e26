"""Pins in the store's ledger (vllm_uma/kv_offload/pins/book.py): made, listed,
renewed, expired and unpinned; held against the LRU of every server on the
store; refused over budget with the numbers, nothing changed."""

from __future__ import annotations

import pytest

from tests.unit.ledger_kit import NS, Unlinks, never, ref
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.ledger.room import Refusal
from vllm_uma.kv_offload.pins import book

OTHER = b"\x22" * 16
ROOMY = book.PinBudget(share=1.0, cap_bytes=None)


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path)
    led.create()
    yield led
    led.close()


def stored(led: Ledger, i: int, stamp: int, cap=None, ns=NS):
    got = led.reserve(ref(i, ns), 10, stamp, cap, "w1", never, Unlinks())
    assert isinstance(got, list), got
    led.commit(ref(i, ns), 10, stamp, "w1")
    return got


def pin(led, name, blocks, *, ns=NS, ttl_s=None, budget=ROOMY, now=None):
    keys = [ref(i, ns).key for i in blocks]
    return book.pin(
        led, ns, name, keys, block_bytes=10, tokens=32 * len(keys), ttl_s=ttl_s, budget=budget,
        now=now,
    )  # fmt: skip


def test_a_pinned_block_is_no_victim_for_any_server_until_unpinned(tmp_path, ledger):
    for i in range(3):
        stored(ledger, i, 100 + i)
    pin(ledger, "system", [0, 1])
    # Another server's handle on the same store: the pin is in the file.
    other = Ledger(tmp_path)
    got = other.reserve(ref(3), 10, 200, 30, "w2", never, Unlinks())
    assert got == [(ref(2), 10)]  # not the least recent 0 or 1: they are pinned
    other.commit(ref(3), 10, 200, "w2")
    pin(other, "doc", [3])
    assert other.reserve(ref(4), 10, 300, 30, "w2", never, Unlinks()) is Refusal.NO_ROOM
    assert [p.name for p in book.pins(other)] == ["system", "doc"]
    book.unpin(other, "system")
    assert other.reserve(ref(4), 10, 300, 30, "w2", never, Unlinks()) == [(ref(0), 10)]
    other.close()


def test_an_expired_pin_holds_nothing_and_is_pruned(ledger):
    stored(ledger, 0, 100)
    pin(ledger, "brief", [0], ttl_s=5, now=1000.0)  # expired long ago
    assert book.pins(ledger) == []
    assert book.live_keys(ledger, NS) == frozenset()
    assert ledger.reserve(ref(1), 10, 200, 10, "w1", never, Unlinks()) == [(ref(0), 10)]
    assert book.prune_expired(ledger) == 1


def test_a_live_pin_lists_its_blocks_bytes_and_what_is_on_disk(ledger):
    stored(ledger, 0, 100)
    made = pin(ledger, "doc", [0, 1, 2], ttl_s=3600)
    assert (made.blocks, made.bytes, made.blocks_on_disk) == (3, 30, 1)
    (listed,) = book.pins(ledger)
    shown = listed.as_json(listed.created)
    assert shown["blocks"] == 3 and shown["bytes"] == 30 and shown["blocks_on_disk"] == 1
    assert shown["ttl_s"] == pytest.approx(3600)
    assert book.pinned_keys(ledger, NS, "doc") == [ref(i).key for i in range(3)]


def test_pinning_a_name_again_replaces_it(ledger):
    pin(ledger, "system", [0, 1], ttl_s=60)
    pin(ledger, "system", [5], ttl_s=None)
    (only,) = book.pins(ledger)
    assert only.blocks == 1 and only.expires is None
    assert book.live_keys(ledger, NS) == {ref(5).key}


def test_pins_are_namespaced(ledger):
    stored(ledger, 0, 100, ns=OTHER)
    pin(ledger, "system", [0], ns=NS)  # the same key bytes, another model's
    assert book.live_keys(ledger, OTHER) == frozenset()
    # OTHER's block of the same key is no pin's: a victim as any.
    assert ledger.reserve(ref(1), 10, 200, 10, "w1", never, Unlinks()) == [(ref(0, OTHER), 10)]


def test_a_pin_over_the_disk_budget_is_refused_with_the_numbers_and_changes_nothing(ledger):
    budget = book.PinBudget(share=0.5, cap_bytes=100)  # 50 B for pins: 5 blocks
    pin(ledger, "a", [0, 1, 2], budget=budget)
    pin(ledger, "b", [1, 2, 3, 4], budget=budget)  # shared blocks count once: 5
    with pytest.raises(book.PinError) as refused:
        pin(ledger, "c", [5], budget=budget)
    message = str(refused.value)
    assert "'c' refused" in message and "60 B" in message and "budget of 50 B" in message
    assert "pin_share 0.5" in message and "100 B cap" in message
    assert [p.name for p in book.pins(ledger)] == ["a", "b"]
    assert book.live_keys(ledger, NS) == {ref(i).key for i in range(5)}


def test_a_pin_over_the_pool_budget_is_refused(ledger):
    budget = book.PinBudget(share=0.5, cap_bytes=None, pool_rows=4)
    pin(ledger, "a", [0, 1], budget=budget)
    with pytest.raises(book.PinError, match="host pool's pin budget of 2 blocks"):
        pin(ledger, "b", [2], budget=budget)
    pin(ledger, "c", [2], ns=OTHER, budget=budget)  # another model's pool: its own


@pytest.mark.parametrize(
    ("name", "ttl_s", "words"),
    [
        ("", 1, "not valid"),
        ("../x", 1, "not valid"),
        ("a" * 65, 1, "not valid"),
        ("ok", 0, "ttl_s 0"),
        ("ok", -5, "ttl_s -5"),
        ("ok", float("nan"), "ttl_s nan"),
        ("ok", "60", "ttl_s '60'"),
        ("ok", True, "ttl_s True"),
        ("ok", 1e12, "ten years"),
    ],
)
def test_bad_names_and_ttls_are_refused(ledger, name, ttl_s, words):
    with pytest.raises(book.PinError, match=words):
        book.pin(ledger, NS, name, [b"k"], block_bytes=1, tokens=1, ttl_s=ttl_s, budget=ROOMY)
    assert book.pins(ledger) == []


def test_an_empty_pin_and_an_unknown_unpin_are_refused(ledger):
    with pytest.raises(book.PinError, match="shorter than one KV block"):
        pin(ledger, "tiny", [])
    with pytest.raises(book.PinNotFound, match="no pin named 'nope'"):
        book.unpin(ledger, "nope")


def test_a_name_in_two_namespaces_needs_the_namespace_to_unpin(ledger):
    pin(ledger, "system", [0], ns=NS)
    pin(ledger, "system", [0], ns=OTHER)
    with pytest.raises(book.PinError, match="2 namespaces"):
        book.unpin(ledger, "system")
    (gone,) = book.unpin(ledger, "system", OTHER)
    assert gone.namespace == OTHER
    assert [p.namespace for p in book.pins(ledger)] == [NS]


def test_pinned_blocks_on_disk_are_counted_for_the_metric(ledger):
    stored(ledger, 0, 100)
    stored(ledger, 1, 100)
    stored(ledger, 2, 100, ns=OTHER)
    pin(ledger, "doc", [0, 5])  # block 5 not stored yet
    pin(ledger, "same", [0])  # counted once
    pin(ledger, "theirs", [2], ns=OTHER)
    assert book.pinned_on_disk(ledger, NS) == (1, 10)
    assert book.pinned_on_disk(ledger, OTHER) == (1, 10)
