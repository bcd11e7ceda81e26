"""API server process: one request to vLLM's own app, in-process, as ASGI.

The pins API (http_api.py) makes a pin by running the prompt through vLLM's
completions or chat endpoint: same tokenizer, chat template, validation,
API-key check and errors as any client's request, with no socket and no
second connection. The call enters the middleware stack below ours, with
the caller's scope (so ``request.app`` is vLLM's app) and only the headers
that matter (the caller's Authorization).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def post_json(app, scope: dict, path: str, body: dict) -> tuple[int, Any]:
    """POST ``body`` to ``path`` through ``app``; the status and the parsed
    JSON reply (or its text, if it is not JSON)."""
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    headers += [(k, v) for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
    inner = {
        **scope,
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
    }
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        # The inner client never disconnects: vLLM's disconnect listener
        # waits here until the handler ends and cancels it.
        await never.wait()
        return {"type": "http.disconnect"}

    status = 500
    chunks: list[bytes] = []

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(inner, receive, send)
    raw = b"".join(chunks)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")
