"""A server that takes its API key on every path, not only vLLM's guarded ones.

vLLM's ``--api-key`` checks the paths under ``/v1``, ``/v2``, ``/inference``
and ``/cohere`` only (its ``GUARDED_PREFIX``). A fleet's server also answers
``/tokenize`` and ``/detokenize``, ``/abort_requests`` (with
``--enable-scale-out``, which the fleet sets), ``/kv_event_sources``,
``/load``, ``/version``, the profiler's and, in dev mode, the endpoints that
sleep the engine or run code in it: all open to whoever reaches the
server's port, which is the network with ``--advertise``.

:class:`GuardEveryPath` (added by ``vllm-uma serve --api-key-file`` with
vLLM's own ``--middleware``) refuses every request without one of the keys
(401, as vLLM), except:
- ``/health``: vllm-router's health checks send no key (vllm-router 0.1.17,
  ``core/worker.rs``), nor does a load balancer's;
- ``/metrics``: Prometheus scrapes without one; it tells counts, not prompts;
- OPTIONS, a browser's CORS preflight, which vLLM lets through too.
A path vLLM adds in a later release is guarded from its first day.

vLLM builds the middleware with no arguments, so the keys come from the
file that ``$VLLM_UMA_API_KEY_FILE`` names (set by commands/serve.py from
``--api-key-file``): a path in the environment, never the key.
"""

from __future__ import annotations

import json
import os

from vllm_uma.fleet.api_key import ApiKeys, read_key_file

KEY_FILE_ENV = "VLLM_UMA_API_KEY_FILE"
OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/"})
_REFUSED = json.dumps({"error": "Unauthorized"}).encode()


class GuardEveryPath:
    """Pure ASGI middleware: a request without one of the keys gets 401."""

    def __init__(self, app, keys: ApiKeys | None = None):
        self.app = app
        if keys is None:
            path = os.environ.get(KEY_FILE_ENV)
            if not path:
                raise RuntimeError(
                    f"{__name__}.GuardEveryPath needs the key file in ${KEY_FILE_ENV}: start "
                    f"the server with `vllm-uma serve --api-key-file PATH`."
                )
            keys = read_key_file(path)
        self.keys = keys

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS or self.keys.accepts(_authorization(scope)):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            # Refused before the handshake completes (1008: policy violation).
            return await send({"type": "websocket.close", "code": 1008})
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_REFUSED)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _REFUSED})


def _authorization(scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return value.decode("latin-1")
    return None
