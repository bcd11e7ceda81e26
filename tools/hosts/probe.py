"""Measure a link between two simulated hosts: a small TCP server on one, a
client on the other, for a transfer's throughput and a round trip's time.

    python -m tools.hosts.probe serve --bind ADDR --port P [--lifetime S]
    python -m tools.hosts.probe send --to ADDR --port P --mbytes N [--start-at T]
                                     -> {"mbit_s": ..., "start": ..., "end": ...}
    python -m tools.hosts.probe rtt --to ADDR --port P [--rounds N]  -> {"rtt_ms": ...}

Each is bounded: the server exits after ``--lifetime`` seconds, a client
after its timeout. Run them inside the hosts with Network.popen.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import time

_CHUNK = 256 * 1024


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("peer closed")
        data += part
    return data


def _handle(conn: socket.socket) -> None:
    # A request is one letter and a count: "S" n: the client sends n bytes,
    # the server answers b"k" once all have arrived; "E" n: echo one byte n times.
    kind, count = struct.unpack("!cQ", _recv_exact(conn, 9))
    if kind == b"S":
        left = count
        while left:
            part = conn.recv(min(_CHUNK, left))
            if not part:
                return
            left -= len(part)
        conn.sendall(b"k")
    elif kind == b"E":
        for _ in range(count):
            conn.sendall(_recv_exact(conn, 1))


def serve(bind: str, port: int, lifetime: float) -> None:
    deadline = time.monotonic() + lifetime
    with socket.create_server((bind, port)) as server:
        while (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                try:
                    _handle(conn)
                except (OSError, ConnectionError):
                    pass


def _connect(to: str, port: int, timeout: float) -> socket.socket:
    """Connect, retrying while the server is not listening yet, up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((to, port), timeout=timeout)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def send(to: str, port: int, nbytes: int, timeout: float, start_at: float = 0.0) -> dict:
    """Send ``nbytes`` and wait for the receipt: Mbit/s over the whole exchange,
    and its wall-clock start and end (every namespace shares the clock), from
    which several senders' aggregate rate is computed. ``start_at``: a wall
    time to wait for once connected, so that several senders start together."""
    with _connect(to, port, timeout) as sock:
        time.sleep(max(0.0, start_at - time.time()))
        block = bytes(_CHUNK)
        wall, start = time.time(), time.perf_counter()
        sock.sendall(struct.pack("!cQ", b"S", nbytes))
        left = nbytes
        while left:
            left -= sock.send(block[: min(_CHUNK, left)])
        _recv_exact(sock, 1)
        took = time.perf_counter() - start
        return {"mbit_s": round(nbytes * 8 / took / 1e6, 2), "start": wall, "end": wall + took}


def rtt(to: str, port: int, rounds: int, timeout: float) -> float:
    """The median time of one byte's round trip, in ms, on one connection."""
    with _connect(to, port, timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(struct.pack("!cQ", b"E", rounds))
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            sock.sendall(b"x")
            _recv_exact(sock, 1)
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.hosts.probe")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--bind", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--lifetime", type=float, default=30.0)
    for name in ("send", "rtt"):
        p = sub.add_parser(name)
        p.add_argument("--to", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--timeout", type=float, default=10.0)
        if name == "send":
            p.add_argument("--mbytes", type=float, default=4.0)
            p.add_argument("--start-at", type=float, default=0.0, help="wall time (time.time())")
        else:
            p.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.bind, args.port, args.lifetime)
    elif args.command == "send":
        nbytes = int(args.mbytes * 1e6)
        print(json.dumps(send(args.to, args.port, nbytes, args.timeout, args.start_at)))
    else:
        print(json.dumps({"rtt_ms": round(rtt(args.to, args.port, args.rounds, args.timeout), 4)}))


if __name__ == "__main__":
    main()
