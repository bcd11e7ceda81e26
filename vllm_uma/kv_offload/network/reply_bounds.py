"""What the KV server's replies may cost a thread: a deadline and a number of bytes.

Engine-core process, on the tier's threads. A round trip (round_trips.py)
reads its replies under one ``Bounds``: one deadline that every socket
read and send honours, the largest bulk string a reply may hold (a load's
is one block's value), and the bytes all its replies may take together.
The parser (bounded_replies.py) knows a bulk string's length from its
``$N`` line before it reads a byte of it, and refuses one over the bounds
unread: the connection is dropped, so the rest never reaches this process.

The bounds reach the parser and the connection through a context variable:
valkey-py builds both, and a connection opened in the middle of a round
trip (its AUTH, SELECT and CLIENT SETNAME replies) is read under the same
deadline. A read outside any round trip (the start-up checks, the watch
thread's PING) gets its own bounds per reply: the connection's timeout and
``DEFAULT_REPLY_BYTES``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from valkey.exceptions import ValkeyError

# A reply outside a round trip: an INFO is ~6 KB, a SCAN page of 1000
# names ~100 KB, CLUSTER SLOTS of a map cut in 16384 ranges ~1.5 MB.
DEFAULT_REPLY_BYTES = 8 << 20


@dataclass(slots=True)
class Bounds:
    deadline: float  # time.monotonic(); every read and send ends by then
    max_bulk: int  # the largest bulk string (a value) a reply may hold
    budget: int  # the bytes every reply under these bounds may still take


_CURRENT: ContextVar[Bounds | None] = ContextVar("vllm_uma_reply_bounds", default=None)


@contextlib.contextmanager
def bounded(bounds: Bounds) -> Iterator[Bounds]:
    """Every reply read and command sent on this thread, until the end of
    the block, under ``bounds``."""
    token = _CURRENT.set(bounds)
    try:
        yield bounds
    finally:
        _CURRENT.reset(token)


def current() -> Bounds | None:
    return _CURRENT.get()


def per_reply(timeout_s: float | None) -> Bounds:
    """The bounds of one reply read outside a round trip."""
    deadline = float("inf") if timeout_s is None else time.monotonic() + timeout_s
    return Bounds(deadline, DEFAULT_REPLY_BYTES, DEFAULT_REPLY_BYTES)


class OversizedReply(ValkeyError):
    """A reply larger than its bounds, refused before its bytes were read;
    its connection is dropped. In an array (an MGET), ``position`` is the
    index of the element refused and ``partial`` the elements before it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.position: int | None = None
        self.partial: list = []
