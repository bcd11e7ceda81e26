"""A pin's bundle over a real socket (pins/http_bundles.py, http_stream.py):
the pins middleware served by uvicorn, as ``vllm-uma serve`` serves it, in a
thread on a free port of 127.0.0.1; a pin of 2048 blocks (16 MiB), more
than the socket buffers hold, so the stream waits on the client. No vLLM
engine (a stand-in route answers the namespace probe). The routes'
checks on a test client: tests/unit/test_pins_http_bundles.py."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from tests.unit.disk_tier_kit import FILE, InfoLog, Primary, key
from tests.unit.pins_bundle_kit import (
    BUNDLE_URL,
    IMPORT_URL,
    TAR,
    Server,
    a_store,
    block_path,
    pin,
    scratch,
)
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.pins import book, http_stream

KEYS = [key(k) for k in range(2048)]


@contextlib.contextmanager
def served(server: Server):
    """``server``'s app on uvicorn in a thread; its base URL."""
    config = uvicorn.Config(server.app, host="127.0.0.1", port=0, log_level="warning")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    port = runner.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        runner.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    root = tmp_path_factory.mktemp("big") / "a"
    a_store(root, Primary(), keys=KEYS)
    pin(root, keys=KEYS)
    return root


def until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def test_round_trip_through_uvicorn_streamed_both_ways(big_source, tmp_path, monkeypatch):
    target = tmp_path / "b"
    a_store(target, Primary())
    a = Server(big_source, monkeypatch)
    b = Server(target, monkeypatch, cap_blocks=2 * len(KEYS) + 2)
    tar = tmp_path / "system.tar"
    with served(a) as url:
        a.use()
        with httpx.stream("GET", url + BUNDLE_URL, timeout=60) as got:
            assert got.status_code == 200
            with tar.open("wb") as f:
                for chunk in got.iter_bytes():
                    f.write(chunk)
            assert tar.stat().st_size == int(got.headers["content-length"]) > len(KEYS) * FILE
    assert scratch(big_source) == []

    def body():  # sent chunked, as a client streaming a file sends it
        with tar.open("rb") as f:
            while chunk := f.read(100_000):
                yield chunk

    with served(b) as url:
        b.use()
        put = httpx.post(url + IMPORT_URL, content=body(), headers=TAR, timeout=60)
    assert put.status_code == 200, put.text
    assert put.json()["blocks_written"] == len(KEYS)
    for k in (KEYS[0], KEYS[1000], KEYS[-1]):
        assert block_path(target, k).read_bytes() == block_path(big_source, k).read_bytes()
    ledger = Ledger(target / ".noindex")
    (made,) = book.pins(ledger)
    ledger.close()
    assert made.blocks_on_disk == len(KEYS)
    assert scratch(target) == []


def test_a_client_gone_mid_stream_stops_it_and_leaves_no_scratch(big_source, monkeypatch):
    a = Server(big_source, monkeypatch)
    with served(a) as url, InfoLog(logging.getLogger(http_stream.logger.name)) as log:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"GET {BUNDLE_URL} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200")
            # Read a little, then go: the server's writes back up meanwhile.
            time.sleep(0.2)
        until(lambda: scratch(big_source) == [])
        until(lambda: any("the client went away" in m for m in log.messages))
