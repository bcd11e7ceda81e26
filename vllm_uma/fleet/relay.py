"""Carry one server's KV events to the router, on loopback only.

Why a relay: vllm-router 0.1.17 subscribes by *connecting* to
``tcp://HOST:PORT`` (it refuses ipc:// and anything else: "KV endpoint
must be tcp://HOST:PORT"), so something must listen. vLLM's publisher
listens only on a wildcard (``tcp://*:PORT``, every interface: anyone who
can reach the host could read which prompts it holds) and otherwise
connects. So the supervisor listens for both, on 127.0.0.1:

    server PUB --connect--> [XSUB 127.0.0.1:in | relay | XPUB 127.0.0.1:out] <--connect-- router SUB

One relay per server (the router tells workers apart by endpoint), each a
thread of the ``vllm-uma fleet`` process running ``zmq.proxy_steerable``:
subscriptions flow up, events flow down, nothing is parsed or kept. A
server that restarts connects to the same port again.
"""

from __future__ import annotations

import threading

import zmq


class EventRelay:
    def __init__(self, ctx: zmq.Context, inbound_port: int, outbound_port: int):
        self.inbound = f"tcp://127.0.0.1:{inbound_port}"  # the server publishes here
        self.outbound = f"tcp://127.0.0.1:{outbound_port}"  # the router reads here
        self._ctx = ctx
        self._control = f"inproc://relay-{inbound_port}"
        self._ready = threading.Event()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name=f"kv-relay-{inbound_port}")
        self._thread.daemon = True
        self._thread.start()
        self._ready.wait(5)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        frontend = self._ctx.socket(zmq.XSUB)
        backend = self._ctx.socket(zmq.XPUB)
        control = self._ctx.socket(zmq.PAIR)
        try:
            frontend.bind(self.inbound)
            backend.bind(self.outbound)
            control.bind(self._control)
        except zmq.ZMQError as exc:
            self._error = exc
            self._ready.set()
            for sock in (frontend, backend, control):
                sock.close(linger=0)
            return
        self._ready.set()
        try:
            zmq.proxy_steerable(frontend, backend, None, control)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (frontend, backend, control):
                sock.close(linger=0)

    def stop(self) -> None:
        stopper = self._ctx.socket(zmq.PAIR)
        try:
            stopper.connect(self._control)
            stopper.send(b"TERMINATE")
        finally:
            stopper.close(linger=0)
        self._thread.join(5)
