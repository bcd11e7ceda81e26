"""The fleet's gate: what clients, and what the fleet's hosts, may ask of the router.

vllm-router 0.1.17 (read in its sdist, ``src/server.rs``) serves its worker
administration on the port of ``/v1/*``, to anyone: ``/add_worker``,
``/remove_worker``, ``/list_workers``, ``/workers[/URL]``, ``/flush_cache``,
``/get_loads``, ``/scheduling/diagnostics``, ``/finish_session``. A client
could add its own "worker" and read other users' prompts, or remove every
server. And it passes any path it does not know to a worker as it is,
with its own ``--api-key`` (measured: a client's ``POST /tokenize`` reached a
worker with the router's key), so a key on the servers alone would not
keep clients off their other endpoints.

Why a gate of ours, not vllm-router's flags or the kernel's firewall:
- vllm-router has no admin key, admin port or admin bind address. Its one
  client check (``--api-key-validation-urls``, in the Rust binary only, not
  in the Python launcher pip installs) puts one bearer check on every route
  alike; its ``--api-key`` is what it sends to workers.
- a firewall filters ports and addresses, and ``/add_worker`` and
  ``/v1/chat/completions`` share a port; nor are nft or iptables installed
  on a fresh Debian (nor here), and its rules would need root and a clean
  removal on every exit path.

So the router listens on 127.0.0.1 on a port of its own (fleet/plan.py), and
the gate, a thread of the ``vllm-uma fleet`` process, listens where clients
reach the fleet (``--host``/``--port``) and passes on:
- ``/v1/*`` (but LoRA loading, which changes what a server serves),
  ``/health`` and ``/metrics``: to any client, or with ``--client-key-file``
  (/health excepted) to one holding a key of that file or the fleet's;
- the administration above: only with the fleet's API key (403 otherwise),
  which only the fleet's hosts hold (``--api-key-file``, fleet/api_key.py);
- anything else: 404.
A request passed on carries the fleet's API key in place of the client's
``Authorization``: vllm-router forwards that header to the server on
``/v1/*`` (measured: the typed and proxied paths send the client's header,
not its ``--api-key``), and the servers require the fleet's key
(fleet/server_guard.py). A client's own key never reaches a server.

What it does not do: TLS (the keys cross the network in clear, as the
router's and the servers' HTTP does; docs/fleet.md says what to run on a
shared network). Local users of the router's host can still reach the
router's own loopback port: vllm-router binds TCP only.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import aiohttp
from aiohttp import web

from vllm_uma.fleet.api_key import ApiKeys
from vllm_uma.log import get_logger

logger = get_logger(__name__)

ADMIN_PATHS = frozenset(
    {"/add_worker", "/remove_worker", "/list_workers", "/flush_cache", "/get_loads",
     "/scheduling/diagnostics", "/finish_session", "/workers"}
)  # fmt: skip
CLIENT_PATHS = frozenset({"/health", "/metrics"})
# vLLM's runtime LoRA endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING): they load
# an adapter from a path on the server's host into what it serves.
NOT_FOR_CLIENTS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
# Hop-by-hop fields (RFC 9110 7.6.1) belong to one connection; Host and
# the body's framing are the upstream request's own.
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade", "proxy-connection"}
)  # fmt: skip
_NOT_FORWARDED = _HOP | {"host", "authorization", "content-length"}
# As vllm-router's default --max-payload-size: the gate refuses nothing the router would take.
MAX_BODY = 512 * 1024 * 1024
START_S = 10.0


class GateError(RuntimeError):
    """The gate cannot listen: the message has the address and the fix."""


def kind_of(path: str) -> str:
    """``"admin"``, ``"client"`` or ``"refused"`` for a request's raw path."""
    if path in ADMIN_PATHS or path.startswith("/workers/"):
        return "admin"
    if path in CLIENT_PATHS or (path.startswith("/v1/") and path not in NOT_FOR_CLIENTS):
        return "client"
    return "refused"


class Gate:
    def __init__(
        self,
        host: str,
        port: int,
        upstream: str,
        fleet_keys: ApiKeys | None,
        client_keys: ApiKeys | None = None,
    ):
        """Listen on ``host:port`` for ``upstream`` (the router's loopback URL).
        ``fleet_keys``: None only where no server takes a key (tests, the
        fleet benchmark): then no host can administer the router through
        the gate. ``client_keys``: None, any client is served."""
        self.url = f"http://{host}:{port}"
        self._upstream = upstream.rstrip("/")
        self._fleet = fleet_keys
        self._clients = client_keys
        self._sock = _listen(host, port)  # here: a busy port fails the caller at once
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"fleet-gate-{port}", daemon=True)
        self._thread.start()
        self._started.wait(START_S)
        if self._error is not None:
            raise GateError(f"the gate at {self.url} did not start: {self._error}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._started.set()
            return
        self._loop.run_forever()

    async def _serve(self) -> None:
        # No pool limit: the router has its own queue (--max-concurrent-requests);
        # no decompression: bytes pass as the router sent them.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        self._started.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # The raw path: what is judged here is what the router gets.
        path = request.rel_url.raw_path
        kind = kind_of(path)
        auth = request.headers.get("Authorization")
        if kind == "refused":
            return _error(404, f"{path} is not served here: the fleet's router serves "
                          f"/v1/*, /health and /metrics.")  # fmt: skip
        if kind == "admin" and not (self._fleet is not None and self._fleet.accepts(auth)):
            return _error(403, f"{path} changes or reads the fleet's workers: only the "
                          f"fleet's hosts may, with its API key (--api-key-file).")  # fmt: skip
        if kind == "client" and path != "/health" and not self._client_accepted(auth):
            return _error(401, "this fleet serves clients with a key: send Authorization: "
                          "Bearer KEY, a key of the fleet's --client-key-file.")  # fmt: skip
        return await self._forward(request)

    def _client_accepted(self, auth: str | None) -> bool:
        if self._clients is None:
            return True
        fleet = self._fleet is not None and self._fleet.accepts(auth)
        return fleet or self._clients.accepts(auth)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        if self._fleet is not None:
            headers.update(self._fleet.header())
        body = await request.read()
        target = self._upstream + request.rel_url.raw_path_qs
        try:
            upstream = await self._session.request(
                request.method, target, headers=headers, data=body, allow_redirects=False
            )
        except aiohttp.ClientError as exc:
            return _error(502, f"the fleet's router does not answer ({exc}).")
        async with upstream:
            reply = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP:
                    reply.headers.add(name, value)
            await reply.prepare(request)
            try:
                # Each chunk as it comes: a streamed completion's events are not held.
                async for chunk in upstream.content.iter_any():
                    await reply.write(chunk)
                await reply.write_eof()
            except (ConnectionResetError, aiohttp.ClientError):
                pass  # the client left, or the router broke off: the connection ends
        return reply

    def stop(self) -> None:
        """Stop listening and end the thread; requests in flight are cut."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            await self._runner.cleanup()
            await self._session.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(START_S)
        except Exception as exc:  # noqa: BLE001 - the loop stops regardless
            logger.warning("fleet: the gate at %s did not close cleanly: %s", self.url, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_S)
        self._loop.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise GateError(
            f"the fleet cannot listen for clients at {host}:{port} ({exc.strerror}): choose "
            f"another --port, stop what holds it, or give --host an address of this host."
        ) from None
    sock.setblocking(False)
    return sock


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
