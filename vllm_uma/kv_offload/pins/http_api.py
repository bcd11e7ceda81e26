"""API server process: ``/v1/uma/pins``, the pins API of ``vllm-uma serve``.

An ASGI middleware (``vllm-uma serve`` adds it with vLLM's own
``--middleware``; without a disk tier its routes answer 400 with the
reason), so the routes sit beside vLLM's without touching its router.
Behind vLLM's API key: with ``--api-key`` (or ``$VLLM_API_KEY``) the
routes are wrapped in vLLM's own AuthenticationMiddleware, as every
``/v1`` path is; ``--api-key-file``'s guard (fleet/server_guard.py) sits
outside this one.

    POST   /v1/uma/pins          {"name", one of "prompt" | "messages" |
                                  "prompt_token_ids", "ttl_s" (null: until
                                  unpinned), "model" (optional)}
    GET    /v1/uma/pins          the live pins of the store, all models
    DELETE /v1/uma/pins/NAME     unpin (``?namespace=HEX`` if two models
                                  have a pin of that name)
    GET    /v1/uma/pins/NAME/bundle   a pin's blocks as a tar; POST
           /v1/uma/pins/import        one in (http_bundles.py)

A POST runs the prompt through vLLM's completions (or, for messages, chat)
endpoint in-process (asgi_call.py) with ``max_tokens: 1``: what no tier
holds is prefilled and stored down the tiers (the warm-up), what one holds
is restored; the engine answers with the prompt's full-block keys
(request_keys.py), and the pin is written to the ledger (book.py) off the
event loop, its budget checked in the same transaction. Counted on vLLM's
/metrics (pins/metrics.py). Errors are vLLM's
shape, ``{"error": {"message", "type", "code"}}``: 400 for a bad request,
404 for an unknown pin, 409 for a pin the budget refuses, 413 for a
bundle too large, 503 when the store's ledger cannot be used now
(nothing changed: try again).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.layout import NOINDEX
from vllm_uma.kv_offload.disk.ledger.db import LedgerDB
from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.api_requests import (
    PREFIX,
    ApiError,
    disk_settings,
    error_body,
    json_body,
    namespace_arg,
    pin_request,
    warm_request,
)
from vllm_uma.kv_offload.pins.asgi_call import post_json
from vllm_uma.kv_offload.pins.metrics import VIA_API, VIA_WARM_UP, WARM_UP_HEADER, PinMetrics
from vllm_uma.kv_offload.pins.request_keys import PIN_PARAM
from vllm_uma.log import get_logger, human_size
from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now (as text: nothing of vLLM is
# imported until a request comes): plugin/vllm_contract/.
vllm_contract.require(__name__)

logger = get_logger(__name__)


class PinRoutes:
    """Pure ASGI middleware: ``/v1/uma/pins`` here, every other path on."""

    def __init__(self, app, registry=None):
        """``registry``: where the counters go (pins/metrics.py); None: the
        one vLLM's /metrics serves in this process."""
        self.app = app
        self._handler = None
        self._ledger: LedgerDB | None = None
        if registry is None:
            from vllm.v1.metrics.prometheus import get_prometheus_registry

            registry = get_prometheus_registry()
        self._metrics = PinMetrics(registry)
        # Imported here: http_bundles.py uses this module's errors and helpers.
        from vllm_uma.kv_offload.pins.http_bundles import BundleRoutes

        self._bundles = BundleRoutes(app)

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        if self._handler is None:
            self._handler = self._guarded(scope["app"])
        await self._handler(scope, receive, send)

    def _guarded(self, vllm_app):
        args = vllm_app.state.args
        tokens = [key for key in (args.api_key or [os.environ.get("VLLM_API_KEY")]) if key]
        if not tokens:
            return self._route
        from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

        return AuthenticationMiddleware(self._route, tokens=tokens)

    async def _route(self, scope, receive, send):
        try:
            status, reply = await self._answer(scope, receive)
        except ApiError as exc:
            status, reply = exc.status, error_body(exc.status, str(exc))
        except book.PinError as exc:
            status = 404 if isinstance(exc, book.PinNotFound) else 400
            reply = error_body(status, str(exc))
        except sqlite3.Error as exc:
            # Busy past its timeout, a full disk: nothing was changed (one
            # transaction), and the client may try again.
            status, reply = 503, error_body(503, f"the store's ledger could not be used ({exc})")
        if callable(reply):  # a bundle's tar, streamed (http_bundles.py)
            await reply(send)
            return
        body = json.dumps(reply).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope, receive) -> tuple[int, Any]:
        method, path = scope["method"], scope["path"]
        disk = disk_settings(scope["app"])
        if self._bundles.handles(method, path):  # GET .../NAME/bundle, POST .../import
            return await self._bundles.answer(scope, receive, disk)
        if path == PREFIX and method == "POST":
            return await self._pin(scope, disk, await json_body(receive))
        if path == PREFIX and method == "GET":
            pins = await asyncio.to_thread(book.pins, self._ledger_of(disk))
            now = time.time()
            return 200, {
                "pins": [_described(p, now, disk.root_dir) for p in pins],
                "pin_share": disk.pin_share,
                "disk_budget_bytes": book.PinBudget(disk.pin_share, disk.cap_bytes).disk_bytes,
            }
        if path.startswith(PREFIX + "/") and method == "DELETE":
            name = unquote(path[len(PREFIX) + 1 :])
            query = parse_qs(scope.get("query_string", b"").decode())
            namespace = namespace_arg(query.get("namespace", [None])[0])
            gone = await asyncio.to_thread(book.unpin, self._ledger_of(disk), name, namespace)
            logger.info("Unpinned %r (namespace %s).", name, gone[0].namespace.hex())
            return 200, {"unpinned": [p.as_json(time.time()) for p in gone]}
        raise ApiError(
            405 if path == PREFIX or path.startswith(PREFIX + "/") else 404,
            f"{method} {path} is not a pins route: POST or GET {PREFIX}, DELETE {PREFIX}/NAME.",
        )

    async def _pin(self, scope, disk, body: Any) -> tuple[int, Any]:
        headers = dict(scope.get("headers", ()))
        via = VIA_WARM_UP if headers.get(WARM_UP_HEADER.encode()) == b"1" else VIA_API
        try:
            status, reply = await self._make_pin(scope, disk, body, via)
        except ApiError as exc:
            outcome = "over_budget" if exc.status == 409 else "refused"
            self._metrics.requests.labels(outcome=outcome, via=via).inc()
            raise
        except book.PinError:
            self._metrics.requests.labels(outcome="refused", via=via).inc()
            raise
        outcome = "pinned" if status == 200 else "refused"
        self._metrics.requests.labels(outcome=outcome, via=via).inc()
        if status == 200:
            self._metrics.tokens.labels(via=via).inc(reply["tokens"])
        return status, reply

    async def _make_pin(self, scope, disk, body: Any, via: str) -> tuple[int, Any]:
        request = pin_request(body)
        name = book.check_name(request.get("name"))
        ttl_s = book.check_ttl(request.get("ttl_s"))
        vllm_app = scope["app"]
        started = time.monotonic()
        status, reply = await post_json(self.app, scope, *warm_request(vllm_app, request))
        if status != 200:
            return status, reply  # vLLM's own error: a bad prompt, an unknown model
        facts = (reply.get("kv_transfer_params") or {}).get(PIN_PARAM)
        if not isinstance(facts, dict):
            raise ApiError(500, "the engine did not report the prompt's blocks")
        if "error" in facts:
            raise ApiError(400, facts["error"])
        budget = book.PinBudget(disk.pin_share, disk.cap_bytes, facts["pool_rows"])
        namespace = bytes.fromhex(facts["namespace"])
        keys = [bytes.fromhex(key) for key in facts["keys"]]
        try:
            made = await asyncio.to_thread(
                book.pin, self._ledger_of(disk), namespace, name, keys,
                block_bytes=facts["block_bytes"], tokens=facts["tokens"], ttl_s=ttl_s,
                budget=budget,
            )  # fmt: skip
        except book.PinOverBudget as exc:
            logger.warning("Pins API: %s", exc)
            raise ApiError(409, str(exc)) from None
        seconds = time.monotonic() - started
        logger.info(
            "Pinned %r: %d tokens, %d blocks (%s), %s, in %.1f s (prefill or restore "
            "included)%s.",
            name, made.tokens, made.blocks, human_size(made.bytes),
            "until unpinned" if ttl_s is None else f"for {ttl_s:g} s", seconds,
            ", a warm-up" if via == VIA_WARM_UP else "",
        )  # fmt: skip
        usage = reply.get("usage") or {}
        return 200, {
            **_described(made, time.time(), disk.root_dir),
            "seconds": round(seconds, 3),
            "prompt_tokens": usage.get("prompt_tokens"),
        }

    def _ledger_of(self, disk) -> LedgerDB:
        if self._ledger is None:
            self._ledger = LedgerDB(Path(disk.root_dir) / NOINDEX)
        return self._ledger


def _described(pin: book.Pin, now: float, root) -> dict:
    info = admin.read_info(Path(root) / NOINDEX / pin.namespace.hex())
    return {**pin.as_json(now), "model": (info or {}).get("model")}
