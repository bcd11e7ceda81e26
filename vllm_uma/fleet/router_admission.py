"""Keep out of the router's KV index what it would refuse, so it keeps the rest.

vllm-router 0.1.17 (read in its sdist, ``src/kv_index/admit.rs`` and
``subscriber.rs``) checks every event of a batch before applying any. One
event it cannot place (a store without token ids, a block size other than
the one it was given, an unknown layout or residency) rejects the whole
batch *and forgets everything it knew about that server*; the server is
credited again only for blocks stored after that. vLLM's host-pool and disk
events are such events unless they are self-describing, and some still are
(blocks a server found on disk at start-up, whose tokens no one recorded;
sliding-window groups). Left in, each one would wipe the server's entry.

So the fleet's relay (relay.py, in the ``vllm-uma fleet`` process, between
each server's publisher and the router) passes each batch through
:func:`admit_batch`: events the router can place pass unchanged, the rest
are dropped with a reason, and the batch keeps its sequence number (a
missing number is, to the router, lost events: it forgets the server too).
A batch that does not decode goes on as an empty one for the same reason.
Nothing here changes what the servers do or store; the router only sees
less, and it could not use what it does not see.

The rules mirror 0.1.17's; a later router that accepts more would merely
see fewer events than it could use (the fleet pins the version).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import msgspec

# Residency strings the router maps to a tier (case-insensitive).
_MEDIA = frozenset({"GPU", "DEVICE", "CPU", "HOST", "HOST_PINNED", "STORAGE", "DISK"})
_TYPES = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


def admit_batch(payload: bytes, block_tokens: int) -> tuple[bytes, list[str]]:
    """The batch with only placeable events, and why each other one was dropped.

    Returns ``payload`` itself when every event passes (the common case:
    nothing is re-encoded).
    """
    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return _empty_batch(), ["undecodable batch"]
    if not (isinstance(batch, list) and 2 <= len(batch) <= 3 and isinstance(batch[1], list)):
        return _empty_batch(), ["batch is not [ts, events, rank]"]
    kept, reasons = [], []
    for event in batch[1]:
        try:
            reason = refusal(event, block_tokens)
        except (TypeError, ValueError, AttributeError):  # a field of an unexpected type
            reason = "malformed event"
        if reason is None:
            kept.append(event)
        else:
            reasons.append(reason)
    if not reasons:
        return payload, []
    return msgspec.msgpack.encode([batch[0], kept, *batch[2:]]), reasons


def refusal(event: object, block_tokens: int) -> str | None:
    """Why the router would refuse ``event`` (and with it the whole batch), or None."""
    if not isinstance(event, Mapping) or event.get("type") not in _TYPES:
        return "unknown event type"
    kind = event["type"]
    if kind == "AllBlocksCleared":
        return None
    hashes = event.get("block_hashes")
    if not isinstance(hashes, list) or not all(_is_hash(h) for h in hashes):
        return f"{kind} without valid block hashes"
    residency = _residency_refusal(event)
    if residency is not None or kind == "BlockRemoved":
        return residency
    return _store_refusal(event, hashes, block_tokens)


def _store_refusal(event: Mapping, hashes: list, block_tokens: int) -> str | None:
    lora = event.get("lora_name")
    extra = event.get("extra_keys")
    # Per-block extra keys: only "none" or the adapter's own name are modelled.
    modelled = (None,) if lora is None else (None, [lora])
    if extra is not None and (len(extra) != len(hashes) or any(k not in modelled for k in extra)):
        return "store with extra keys (cache salt or multimodal)"
    spec = event.get("kv_cache_spec_kind")
    if (spec is not None and spec != "full_attention") or (
        event.get("kv_cache_spec_sliding_window") is not None
    ):
        return f"store of a {spec or 'sliding-window'} group (the router places full attention)"
    if (event.get("lora_id") is not None and lora is None) or lora == "":
        return "store for a LoRA adapter without a name"
    size, tokens = event.get("block_size"), event.get("token_ids")
    if not size or not tokens:
        return "store without token ids (not self-describing)"
    if size != block_tokens:
        return f"store with block size {size}, not {block_tokens}"
    if not isinstance(tokens, list) or len(tokens) != len(hashes) * size:
        return "store whose token count is not blocks x block size"
    return None


def _residency_refusal(event: Mapping) -> str | None:
    pool = bool(event.get("ownership"))
    locality = event.get("locality")
    if locality is not None and locality != ("REMOTE" if pool else "LOCAL"):
        return f"locality {locality!r} with ownership {event.get('ownership')!r}"
    medium = event.get("medium")
    if medium is not None and (not isinstance(medium, str) or medium.upper() not in _MEDIA):
        return f"medium {medium!r}"
    return None


def _is_hash(value: object) -> bool:
    # The router reads a hash as unsigned int or bytes; a negative int is an error.
    return (isinstance(value, int) and value >= 0) or isinstance(value, bytes)


def _empty_batch() -> bytes:
    return msgspec.msgpack.encode([time.time(), []])
