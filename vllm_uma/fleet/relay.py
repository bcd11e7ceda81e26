"""Carry one server's KV events to the router.

Why a relay: vllm-router 0.1.17 subscribes by *connecting* to
``tcp://HOST:PORT`` (it refuses ipc:// and anything else: "KV endpoint
must be tcp://HOST:PORT"), so something must listen on TCP. vLLM's
publisher binds a wildcard (``tcp://*:PORT``: every interface, anyone who
can reach the host could read which prompts it holds, or publish events
that steer the router) or an ``ipc://`` path, and otherwise connects. So
each server binds a Unix socket in this user's private directory (mode
0700: no other local user can connect, plan.py), the relay connects to it,
and listens for the router on 127.0.0.1:

    server PUB  --bind-->  ipc://<private dir>/fleet-...-server-N.sock
                                  ^ connect
                     [XSUB | relay | XPUB 127.0.0.1:out]  <--connect--  router SUB

What is left open, because the router reads TCP only: any local user may
subscribe at 127.0.0.1:out and read the block hashes (docs/fleet.md says
so). Nobody but this user can inject events: the XPUB side carries
subscriptions upstream, never events.

One relay per server (the router tells workers apart by endpoint), each a
thread of the ``vllm-uma fleet`` process: subscriptions flow up unchanged;
each event batch flows down through router_admission.admit_batch, which
drops the events the router would refuse (one of them makes it forget the
whole server) and keeps the batch's sequence number. Each kind of drop is
logged once per relay, and counted (``dropped``). Nothing is kept between
batches. A server that restarts binds the same path again (ZeroMQ replaces
a dead server's socket file) and the relay's connection comes back by
itself.
"""

from __future__ import annotations

import collections
import threading

import zmq

from vllm_uma.fleet.router_admission import admit_batch
from vllm_uma.log import get_logger

logger = get_logger(__name__)


class EventRelay:
    def __init__(
        self,
        ctx: zmq.Context,
        inbound: str,
        outbound_port: int,
        block_tokens: int,
        name: str,
        address: str = "127.0.0.1",
    ):
        self.name = name  # for the log: which server's events
        self.block_tokens = block_tokens  # the router's --kv-event-block-size
        self.dropped: collections.Counter[str] = collections.Counter()  # reason -> events
        self.inbound = inbound  # the server publishes (binds) here: ipc://
        # The router reads here: loopback, or this host's address when the
        # router is on another host (--advertise; docs/fleet.md says who can read).
        self.outbound = f"tcp://{address}:{outbound_port}"
        self._ctx = ctx
        self._control = f"inproc://relay-{outbound_port}"
        self._ready = threading.Event()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name=f"kv-relay-{outbound_port}")
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
            frontend.connect(self.inbound)  # retried by ZeroMQ until the server binds
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
            self._relay(frontend, backend, control)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (frontend, backend, control):
                sock.close(linger=0)

    def _relay(self, frontend: zmq.Socket, backend: zmq.Socket, control: zmq.Socket) -> None:
        poller = zmq.Poller()
        for sock in (frontend, backend, control):
            poller.register(sock, zmq.POLLIN)
        while True:
            for sock, _ in poller.poll():
                if sock is control:
                    if control.recv() == b"TERMINATE":
                        return
                elif sock is backend:  # a (un)subscription from the router
                    frontend.send_multipart(backend.recv_multipart())
                else:
                    backend.send_multipart(self._admit(frontend.recv_multipart()))

    def _admit(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) != 3:  # not vLLM's [topic, seq, batch]: the router judges it
            return frames
        payload, reasons = admit_batch(frames[2], self.block_tokens)
        for reason in reasons:
            if reason not in self.dropped:
                logger.info(
                    "fleet: %s: KV events the router cannot place are not passed on "
                    "(%s; it would forget every block of this server); counted from now",
                    self.name,
                    reason,
                )
            self.dropped[reason] += 1
        return [frames[0], frames[1], payload]

    def stop(self) -> None:
        stopper = self._ctx.socket(zmq.PAIR)
        try:
            stopper.connect(self._control)
            stopper.send(b"TERMINATE")
        finally:
            stopper.close(linger=0)
        self._thread.join(5)
