"""A RESP proxy in front of a real valkey-server that misbehaves on demand.

For the network tier's deadline and flood tests (test_network_tier_deadlines.py):
the tier starts through it honestly (the real KV server answers its checks),
then the test switches its ``mode``:

- ``SLOW``: the KV server's replies are passed on a byte at a time, one every
  ``byte_delay_s`` (a KV server that answers, never in time);
- ``FLOOD``: a GET or MGET is answered by the proxy itself with a value of
  ``flood_bytes`` (1 GiB by default), its ``$`` length first, then zeros for
  as long as the client reads them (``flood_sent`` counts what it took);
- ``HOLD_STORES``: a connection that sends a SET is held: nothing more of
  it reaches the KV server, no reply comes back (stores stuck on a socket);
- ``HONEST``: bytes pass as they are.

A real TCP server on 127.0.0.1 in the test's own process (threads); every
socket is closed by ``stop``.
"""

from __future__ import annotations

import socket
import threading
from enum import Enum

FLOOD_CHUNK = 1 << 20


class Mode(Enum):
    HONEST = "honest"
    SLOW = "slow"
    FLOOD = "flood"
    HOLD_STORES = "hold_stores"


class KvServerProxy:
    def __init__(self, kv_server, byte_delay_s: float = 0.02, flood_bytes: int = 1 << 30):
        self._kv_server = (kv_server.host, kv_server.port)
        self.byte_delay_s = byte_delay_s
        self.flood_bytes = flood_bytes
        self.mode = Mode.HONEST
        self.flood_sent = 0  # bytes of flooded values the clients took
        self._zeros = bytes(FLOOD_CHUNK)  # now: a test measures its own allocations
        self._stopping = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"valkey://{self.host}:{self.port}/0"

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        for thread in self._threads:
            thread.join(5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            kv_server = socket.create_connection(self._kv_server)
            with self._lock:
                self._sockets += [client, kv_server]
            for pump in (self._up, self._down):
                thread = threading.Thread(target=pump, args=(client, kv_server), daemon=True)
                self._threads.append(thread)
                thread.start()

    # -- client to KV server: whole commands, so that a mode can act on one -------

    def _up(self, client: socket.socket, kv_server: socket.socket) -> None:
        pending = b""
        try:
            while data := client.recv(65536):
                pending += data
                while (command := _command(pending)) is not None:
                    raw, name, args = command
                    pending = pending[len(raw) :]
                    if self.mode is Mode.FLOOD and name in (b"GET", b"MGET"):
                        self._flood(client, values=args if name == b"MGET" else None)
                        return
                    if self.mode is Mode.HOLD_STORES and name == b"SET":
                        self._stopping.wait()
                        return
                    kv_server.sendall(raw)
        except OSError:
            pass

    def _flood(self, client: socket.socket, values: int | None) -> None:
        """The first value of the reply is the flood (the others never come)."""
        head = b"" if values is None else b"*%d\r\n" % values
        client.sendall(head + b"$%d\r\n" % self.flood_bytes)
        left = self.flood_bytes
        while left > 0 and not self._stopping.is_set():
            sent = client.send(self._zeros[: min(left, FLOOD_CHUNK)])  # raises once the client cut
            self.flood_sent += sent
            left -= sent

    # -- KV server to client -------------------------------------------------------

    def _down(self, client: socket.socket, kv_server: socket.socket) -> None:
        try:
            while data := kv_server.recv(65536):
                if self.mode is not Mode.SLOW:
                    client.sendall(data)
                    continue
                for i in range(len(data)):
                    if self._stopping.wait(self.byte_delay_s):
                        return
                    client.sendall(data[i : i + 1])
        except OSError:
            pass


def _command(buffer: bytes) -> tuple[bytes, bytes, int] | None:
    """The first whole command in ``buffer`` (a RESP array of bulk strings,
    as every client sends), its name and its number of arguments; None
    until it is all there."""
    end = buffer.find(b"\r\n")
    if end < 0:
        return None
    count, at, name = int(buffer[1:end]), end + 2, b""
    for i in range(count):
        end = buffer.find(b"\r\n", at)
        if end < 0:
            return None
        length = int(buffer[at + 1 : end])
        at = end + 2 + length + 2
        if at > len(buffer):
            return None
        if i == 0:
            name = buffer[end + 2 : end + 2 + length].upper()
    return buffer[:at], name, count - 1
