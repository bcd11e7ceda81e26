"""The fleet's gate (vllm_uma/fleet/gate.py) in this process, without a
fleet: a streamed reply passes event by event, and a busy --port fails the
start before anything runs. With vllm-router and the fleet's servers:
tests/integration/test_fleet_gate.py."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from vllm_uma.fleet.api_key import generate_key_file
from vllm_uma.fleet.gate import Gate, GateError
from vllm_uma.fleet.plan import FleetRequest, plan_fleet
from vllm_uma.fleet.supervisor import Fleet, FleetError
from vllm_uma.server_process import free_port

NEVER_RUN = ["vllm-uma"]  # the fleet here fails before any start


def fleet_request(work: Path, key_file: Path, port: int) -> FleetRequest:
    return FleetRequest(
        servers=1, model="stand-in", serve_flags=(), host="127.0.0.1", port=port,
        policy="round_robin", kv_store=None, events_dir=work, metrics_port=free_port(),
        api_key_file=key_file,
    )  # fmt: skip


class SlowEvents(http.server.BaseHTTPRequestHandler):
    """Streams one event, waits until the test has read it, then a second."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for event, wait in ((b"data: first\n\n", True), (b"data: [DONE]\n\n", False)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            if wait:
                self.release.wait(10)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


def test_a_streamed_reply_passes_event_by_event():
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowEvents)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    gate = Gate("127.0.0.1", free_port(), f"http://127.0.0.1:{upstream.server_port}", None)
    try:
        started = time.monotonic()
        with requests.post(f"{gate.url}/v1/chat/completions", json={"stream": True},
                           stream=True, timeout=20) as reply:  # fmt: skip
            lines = reply.iter_lines()
            first = next(line for line in lines if line)
            # Read while the server still holds the rest: the gate did not wait for it.
            assert first == b"data: first" and time.monotonic() - started < 5
            SlowEvents.release.set()
            assert [line for line in lines if line] == [b"data: [DONE]"]
    finally:
        gate.stop()
        upstream.shutdown()


def children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_a_busy_port_fails_the_start_and_leaves_nothing_running(tmp_path_factory):
    before = children()
    # A short directory: the servers' KV event sockets live in it, and a
    # Unix socket's path takes at most 107 bytes (this test's own tmp_path,
    # under an xdist worker's directory, made 108).
    tmp_path = tmp_path_factory.mktemp("busy")
    key_file = tmp_path / "fleet-api.key"
    generate_key_file(key_file)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(GateError, match=f"cannot listen for clients at 127.0.0.1:{port}"):
            Gate("127.0.0.1", port, "http://127.0.0.1:1", None)
        plan = plan_fleet(fleet_request(tmp_path, key_file, port), [0], free_port)
        fleet = Fleet(plan, NEVER_RUN, tmp_path)
        try:
            with pytest.raises(FleetError, match="choose another --port"):
                fleet.start()
            assert fleet.router is None and fleet.servers == {}  # failed before any start
        finally:
            fleet.stop()
    assert children() <= before
