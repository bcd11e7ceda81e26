"""The network tier's reply parser (network/bounded_replies.py) on a real
socket pair: RESP2 read back whatever the chunking, a value over its bounds
refused before its bytes are read, one deadline for every read."""

from __future__ import annotations

import random
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from valkey._parsers import Encoder
from valkey.exceptions import ResponseError, TimeoutError

from vllm_uma.kv_offload.network.bounded_replies import BoundedParser
from vllm_uma.kv_offload.network.reply_bounds import Bounds, OversizedReply, bounded

READ_SIZE = 65536


@pytest.fixture
def pair():
    ours, kv_server = socket.socketpair()
    parser = BoundedParser(READ_SIZE)
    parser.on_connect(
        SimpleNamespace(_sock=ours, socket_timeout=5.0, encoder=Encoder("utf-8", "strict", False))
    )
    yield parser, kv_server
    ours.close()
    kv_server.close()


def encode(reply) -> bytes:
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if isinstance(reply, ResponseError):
        return b"-%s\r\n" % str(reply).encode()
    return b"*%d\r\n" % len(reply) + b"".join(encode(r) for r in reply)


def random_reply(rng: random.Random, depth: int = 0):
    kind = rng.choice(["bulk", "big", "int", "nil", "error"] + ["array"] * (depth < 2))
    if kind == "bulk":
        return rng.randbytes(rng.randrange(0, 300))
    if kind == "big":  # over the read buffer: read in place
        return rng.randbytes(rng.randrange(READ_SIZE - 4, 3 * READ_SIZE))
    if kind == "int":
        return rng.randrange(-(10**12), 10**12)
    if kind == "error":
        return ResponseError(f"WRONGTYPE number {rng.randrange(1000)}")
    if kind == "nil":
        return None
    return [random_reply(rng, depth + 1) for _ in range(rng.randrange(0, 6))]


def send_in_chunks(kv_server: socket.socket, data: bytes, rng: random.Random) -> threading.Thread:
    def send():
        at = 0
        while at < len(data):
            size = rng.choice([1, 2, 7, 100, 4096, 70000])
            kv_server.sendall(data[at : at + size])
            at += size

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def same(got, want) -> bool:
    if isinstance(want, ResponseError):
        return type(got) is ResponseError and str(got) == str(want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(same, got, want))
    return got == want


def test_replies_come_back_whole_whatever_their_chunking(pair):
    parser, kv_server = pair
    rng = random.Random(7)
    replies = [random_reply(rng) for _ in range(60)]
    sender = send_in_chunks(kv_server, b"".join(encode(r) for r in replies), rng)
    with bounded(Bounds(time.monotonic() + 30, 1 << 20, 1 << 30)):
        got = [parser.read_response() for _ in replies]
    sender.join()
    assert all(map(same, got, replies))
    assert any(isinstance(r, bytes) and len(r) > READ_SIZE for r in replies)


def test_a_value_over_its_bound_is_refused_before_its_bytes(pair):
    parser, kv_server = pair
    # The value's bytes never come: a parser that waited for them would time out.
    kv_server.sendall(b"*3\r\n$3\r\nabc\r\n$1073741824\r\n")
    with bounded(Bounds(time.monotonic() + 5, 1000, 1 << 20)):
        start = time.monotonic()
        with pytest.raises(OversizedReply, match="1073741824 bytes") as refused:
            parser.read_response()
    assert time.monotonic() - start < 1.0
    assert refused.value.position == 1 and refused.value.partial == [b"abc"]


def test_an_array_longer_than_its_bytes_is_refused_at_its_count(pair):
    parser, kv_server = pair
    kv_server.sendall(b"*100000000\r\n")
    with bounded(Bounds(time.monotonic() + 5, 1000, 64 << 10)):
        with pytest.raises(OversizedReply, match="100000000 elements"):
            parser.read_response()


def test_a_reply_a_byte_at_a_time_ends_at_the_deadline_not_per_read(pair):
    parser, kv_server = pair
    stop = threading.Event()

    def trickle():  # every byte well inside a per-read timeout
        for byte in b"$100\r\n" + bytes(100):
            if stop.wait(0.02):
                return
            kv_server.sendall(bytes([byte]))

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    start = time.monotonic()
    with bounded(Bounds(start + 0.3, 1000, 1 << 20)), pytest.raises(TimeoutError):
        parser.read_response()
    assert 0.3 <= time.monotonic() - start < 0.5
    stop.set()
    sender.join()


def test_after_the_deadline_what_came_in_time_is_still_read(pair):
    parser, kv_server = pair
    kv_server.sendall(b"*2\r\n:1\r\n+OK\r\n")
    time.sleep(0.05)
    with bounded(Bounds(time.monotonic() - 1, 1000, 1 << 20)):
        assert parser.read_response() == [1, b"OK"]
        with pytest.raises(TimeoutError):  # and nothing more is waited for
            parser.read_response()
