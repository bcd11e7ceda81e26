"""Engine-core process, scheduler side: what a pinning request reports back.

A request that carries ``kv_transfer_params: {"vllm_uma_pin": true}`` (sent
by the pins API, http_api.py) is served as any other; when it finishes, the
connector (connector.py, ``request_finished``, on the scheduler thread)
adds to the ``kv_transfer_params`` vLLM returns with the response what the
API server needs to write the pin: the offload keys of the prompt's full
blocks (vLLM's own, as its connector computed them for the stores), the
namespace and the size of one block file (the disk tier's), and the host
pool's rows (for the budget). Plain JSON: it crosses to the API server in
the engine's output.
"""

from __future__ import annotations

from typing import Any

PIN_PARAM = "vllm_uma_pin"


def asks_pin(kv_transfer_params: Any) -> bool:
    return isinstance(kv_transfer_params, dict) and kv_transfer_params.get(PIN_PARAM) is True


def pin_reply(manager: Any, keys: list[bytes], tokens: int) -> dict[str, Any]:
    """The reply for a pin of ``keys`` (prefix order), or the reason there
    can be none: pins live in the disk tier's ledger."""
    disk = next(
        (t for t in getattr(manager, "secondary_tiers", ()) if hasattr(t, "pin_facts")), None
    )
    if disk is None:
        return {
            "error": "pins live in the disk KV tier's ledger, and this server has none: serve "
            "with an fs tier in 'secondary_tiers' (docs/sessions.md)."
        }
    namespace, block_bytes = disk.pin_facts
    primary = getattr(manager, "primary_tier", None)
    book = getattr(primary, "book", None)
    return {
        "namespace": namespace.hex(),
        "keys": [key.hex() for key in keys],
        "block_bytes": block_bytes,
        "pool_rows": None if book is None else book.num_rows,
        "tokens": tokens,
    }
