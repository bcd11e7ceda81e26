"""The KV server's replies read under their bounds, and commands sent by their deadline.

Engine-core process, on whichever thread uses a connection. valkey-py's
parsers read a reply until it is whole: each socket read has the
connection's timeout (a KV server that sends a byte a second never times
out), and a bulk string is buffered whole before anyone sees its length (a
1 GiB value is 1 GiB of this process's memory, twice with libvalkey). Ours
(``BoundedParser``, given to valkey-py through its ``parser_class``) reads
RESP2, the protocol the tier speaks, under the bounds of reply_bounds.py:

- every socket read waits only until the deadline; once it has passed, a
  read takes what is already here and never waits (a node read after
  another node's delay still gets the replies it sent in time);
- a ``$N`` line is checked before its N bytes are read: over the bounds, an
  ``OversizedReply`` is raised and valkey-py drops the connection, unread;
  an array's element count is checked the same way (3 bytes per element at
  least), and a line longer than the read buffer is refused;
- a bulk string over the buffer's size is read in place into its own
  ``bytearray`` (one copy fewer than bytes; only values are that large, and
  their reader takes any buffer); smaller ones come back as ``bytes``.

``BoundedConnection`` sends each piece of a command with what is left
until the deadline; valkey-py's ``sendall`` would give each piece (a value)
the whole timeout again. valkey-py has no public hook for either: the
parser reads ``connection._sock`` as its own parsers do (``on_connect``),
and the connection sets the timeout of its own socket before each send.
"""

from __future__ import annotations

import socket
import ssl
import time

import valkey
from valkey._parsers import BaseParser
from valkey.exceptions import ConnectionError, InvalidResponse, TimeoutError

from vllm_uma.kv_offload.network.reply_bounds import Bounds, OversizedReply, current, per_reply

# The smallest RESP2 element ("+\r\n"): an array of N elements is at least 3N bytes.
MIN_ELEMENT_BYTES = 3
# CLUSTER SLOTS nests three deep; nothing we send is answered deeper.
MAX_DEPTH = 8
CLOSED = "the KV server closed the connection"
NO_DATA = (socket.timeout, BlockingIOError, ssl.SSLWantReadError)


class BoundedParser(BaseParser):
    def __init__(self, socket_read_size: int):
        self._buffer = bytearray(socket_read_size)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0  # received, not parsed yet: [start, end)
        self._sock = None
        self._timeout: float | None = None
        self.encoder = None

    def on_connect(self, connection) -> None:
        self._sock = connection._sock
        self._timeout = connection.socket_timeout
        self.encoder = connection.encoder
        self._start = self._end = 0

    def on_disconnect(self) -> None:
        self._sock = None
        self._start = self._end = 0

    def can_read(self, timeout: float) -> bool:
        """Whether a reply's bytes are here, waiting up to ``timeout``."""
        if self._sock is None:
            raise ConnectionError(CLOSED)
        if self._end > self._start:
            return True
        try:
            self._fill(Bounds(time.monotonic() + timeout, 0, 1 << 62))
        except TimeoutError:
            return False
        return True

    def read_response(self, disable_decoding: bool = False):
        if self._sock is None:
            raise ConnectionError(CLOSED)
        bounds = current() or per_reply(self._timeout)
        return self._reply(bounds, not disable_decoding, 0)

    # -- one reply ---------------------------------------------------------------

    def _reply(self, bounds: Bounds, decode: bool, depth: int):
        line = self._line(bounds)
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            length = _number(line)
            if length == -1:
                return None
            value = self._bulk(length, bounds)
        elif kind == b"*":
            count = _number(line)
            return None if count == -1 else self._array(count, bounds, decode, depth)
        elif kind == b":":
            return _number(line)
        elif kind == b"+":
            value = rest
        elif kind == b"-":
            error = self.parse_error(rest.decode("utf-8", errors="replace"))
            if isinstance(error, ConnectionError):  # "max number of clients reached"
                raise error
            return error  # the caller raises it, or keeps it as one reply of a pipeline
        else:
            raise InvalidResponse(f"the KV server sent {line[:40]!r}, which is not RESP2")
        return self.encoder.decode(value) if decode else value

    def _array(self, count: int, bounds: Bounds, decode: bool, depth: int) -> list:
        if count < 0 or depth >= MAX_DEPTH:
            raise InvalidResponse(f"an array of {count} at depth {depth} is not a reply of ours")
        if count * MIN_ELEMENT_BYTES > bounds.budget:
            raise OversizedReply(
                f"an array of {count} elements where at most {bounds.budget} bytes may come: "
                f"refused unread"
            )
        items: list = []
        try:
            for _ in range(count):
                items.append(self._reply(bounds, decode, depth + 1))
        except OversizedReply as exc:
            if depth == 0:  # the caller keeps the elements before the refused one
                exc.position, exc.partial = len(items), items
            raise
        return items

    def _bulk(self, length: int, bounds: Bounds) -> bytes | bytearray:
        if length < 0:
            raise InvalidResponse(f"a bulk string of {length} bytes is not RESP2")
        if length > bounds.max_bulk or length + 2 > bounds.budget:
            raise OversizedReply(
                f"a value of {length} bytes where at most {min(bounds.max_bulk, bounds.budget)} "
                f"may come (a value is one block's bytes): refused unread, the connection dropped"
            )
        bounds.budget -= length + 2
        if length + 2 <= len(self._buffer):
            while self._end - self._start < length + 2:
                self._fill(bounds)
            value = bytes(self._view[self._start : self._start + length])
            self._start += length
        else:
            value = bytearray(length)
            have = min(self._end - self._start, length)
            value[:have] = self._view[self._start : self._start + have]
            self._start += have
            target = memoryview(value)
            while have < length:
                have += self._recv_into(target[have:], bounds)
            while self._end - self._start < 2:
                self._fill(bounds)
        if self._view[self._start : self._start + 2] != b"\r\n":
            raise InvalidResponse(f"a bulk string of {length} bytes not ended by CRLF")
        self._start += 2
        return value

    # -- bytes from the socket ------------------------------------------------------

    def _line(self, bounds: Bounds) -> bytes:
        while (at := self._buffer.find(b"\r\n", self._start, self._end)) < 0:
            if self._end - self._start >= len(self._buffer) - 1:
                raise OversizedReply(
                    f"a reply line longer than {len(self._buffer)} bytes: refused unread"
                )
            self._fill(bounds)
        line = bytes(self._view[self._start : at])
        bounds.budget -= at + 2 - self._start
        if bounds.budget < 0:
            raise OversizedReply("replies longer than their round trip's bytes: refused")
        self._start = at + 2
        return line

    def _fill(self, bounds: Bounds) -> None:
        """At least one more byte in the buffer (what is unread moved to its start)."""
        if self._start:
            unread = self._end - self._start
            self._view[:unread] = self._view[self._start : self._end]
            self._start, self._end = 0, unread
        self._end += self._recv_into(self._view[self._end :], bounds)

    def _recv_into(self, target: memoryview, bounds: Bounds) -> int:
        left = bounds.deadline - time.monotonic()
        # Past the deadline: what is here already is read, nothing waited for.
        self._sock.settimeout(None if left == float("inf") else max(left, 0.0))
        try:
            n = self._sock.recv_into(target)
        except NO_DATA:
            raise TimeoutError("the KV server's reply did not come whole by its deadline") from None
        if n == 0:
            raise ConnectionError(CLOSED)
        return n


def _number(line: bytes) -> int:
    try:
        return int(line[1:])
    except ValueError:
        raise InvalidResponse(f"the KV server sent {line[:40]!r}, which is not RESP2") from None


class _SendsByDeadline:
    """Sends a command's pieces (a value each, for a store) by the deadline
    of the bounds in force; outside a round trip, with the connection's
    timeout, as valkey-py does."""

    def __init__(self, **kwargs):
        super().__init__(parser_class=BoundedParser, **kwargs)

    def send_packed_command(self, command, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()
        pieces = [command] if isinstance(command, str) else list(command)
        bounds = current()
        if bounds is None:
            self._sock.settimeout(self.socket_timeout)
            return super().send_packed_command(pieces, check_health)
        for i, piece in enumerate(pieces):
            left = bounds.deadline - time.monotonic()
            if left <= 0:
                if i:  # half a command is in the socket: the connection is spoilt
                    self.disconnect()
                raise TimeoutError("the command was not sent by its round trip's deadline")
            if left != float("inf"):
                self._sock.settimeout(left)
            super().send_packed_command([piece], check_health and i == 0)


class BoundedConnection(_SendsByDeadline, valkey.Connection):
    """A TCP connection to the KV server (TLS: server_nodes.TlsConnection, a subclass)."""
