"""What the fleet's relay lets through to vllm-router 0.1.17's KV index.

One event the router refuses makes it drop the whole batch and forget the
server, so every such event must be caught here; every event it can place
must pass untouched (else kv_aware loses credit for nothing).
"""

from __future__ import annotations

import msgspec
import pytest

from vllm_uma.fleet.router_admission import admit_batch, refusal

BLOCK = 4


def stored(**changes) -> dict:
    event = {
        "type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": 10,
        "token_ids": list(range(2 * BLOCK)), "block_size": BLOCK, "lora_id": None,
        "medium": "GPU", "lora_name": None, "extra_keys": [None, None], "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }  # fmt: skip
    event.update(changes)
    return event


REMOVED = {"type": "BlockRemoved", "block_hashes": [11], "medium": "CPU"}


@pytest.mark.parametrize(
    "event",
    [
        stored(),  # vLLM's L1 store
        stored(medium="CPU", extra_keys=None),  # self-describing host-pool store
        stored(medium="STORAGE", locality="LOCAL"),  # our disk tier's
        stored(medium="STORAGE", ownership="kvcr", locality="REMOTE"),  # a shared pool's
        stored(lora_name="a", lora_id=1, extra_keys=[["a"], ["a"]]),  # a named adapter
        stored(block_hashes=[b"\x01" * 32, b"\x02" * 32]),  # bytes hashes
        REMOVED,
        {"type": "AllBlocksCleared"},
    ],
)
def test_events_the_router_places_pass(event):
    assert refusal(event, BLOCK) is None


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (stored(token_ids=[], block_size=0, medium="CPU"), "without token ids"),
        (stored(block_size=8, token_ids=list(range(16))), "block size 8, not 4"),
        (stored(token_ids=list(range(7))), "token count"),
        (
            stored(kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=512),
            "sliding_window group",
        ),
        (stored(kv_cache_spec_sliding_window=512), "group"),
        (stored(extra_keys=[None, ["salt"]]), "extra keys"),
        (stored(extra_keys=[None]), "extra keys"),
        (stored(lora_id=3), "LoRA adapter without a name"),
        (stored(lora_name=""), "LoRA adapter without a name"),
        (stored(medium="STORAGE", ownership="fs", locality="LOCAL"), "locality 'LOCAL'"),
        (stored(medium="TAPE"), "medium 'TAPE'"),
        (stored(block_hashes=[-1, 12]), "valid block hashes"),
        ({**REMOVED, "ownership": "fs", "locality": "LOCAL"}, "locality"),
        ({"type": "Mystery"}, "unknown event type"),
        ([1, 2], "unknown event type"),
    ],
)
def test_events_the_router_would_refuse_are_named(event, reason):
    assert reason in refusal(event, BLOCK)


def test_a_malformed_event_is_dropped_not_the_relay():
    payload = msgspec.msgpack.encode([1.5, [stored(extra_keys=7), stored()], None])
    kept, reasons = admit_batch(payload, BLOCK)
    assert msgspec.msgpack.decode(kept) == [1.5, [stored()], None]
    assert reasons == ["malformed event"]


def test_a_clean_batch_is_passed_as_the_same_bytes():
    payload = msgspec.msgpack.encode([1.5, [stored(), REMOVED], None])
    assert admit_batch(payload, BLOCK) == (payload, [])


def test_a_mixed_batch_keeps_its_placeable_events_in_order_and_its_rank():
    bad = stored(token_ids=[], block_size=0, medium="CPU")
    payload = msgspec.msgpack.encode([1.5, [bad, stored(), bad, REMOVED], 0])
    kept, reasons = admit_batch(payload, BLOCK)
    assert msgspec.msgpack.decode(kept) == [1.5, [stored(), REMOVED], 0]
    assert len(reasons) == 2


@pytest.mark.parametrize("payload", [b"\xc1", msgspec.msgpack.encode({"ts": 1}), b""])
def test_a_batch_that_does_not_decode_goes_on_empty(payload):
    kept, reasons = admit_batch(payload, BLOCK)
    ts, events = msgspec.msgpack.decode(kept)
    assert events == [] and reasons and isinstance(ts, float)
