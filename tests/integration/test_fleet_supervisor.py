"""The fleet supervisor's joins (vllm_uma/fleet/supervisor.py), with real
processes: a start that fails or hangs leaves nothing behind, a stop asked
for during a start is honoured within seconds, and a stop never stops
half-way. Each server's restart budget: tests/unit/test_fleet_supervisor_rules.py.

The servers are tests/integration/fake_serve.py (the real port check, then
/health, or a start that hangs); the relays are the real ones, on loopback.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from vllm_uma.fleet import router_front, supervisor
from vllm_uma.fleet.plan import FleetPlan, MemberPlan
from vllm_uma.fleet.supervisor import Fleet, FleetError
from vllm_uma.server_process import free_port

FAKE_SERVE = [sys.executable, str(Path(__file__).with_name("fake_serve.py"))]


def plan(tmp_path: Path, *hangs: bool) -> FleetPlan:
    members = tuple(
        MemberPlan(
            index=i,
            port=free_port(),
            cores=(0,),
            events_in=f"ipc://{tmp_path}/server-{i}.sock",
            events_out_port=free_port(),
            argv=(),
            env={"FAKE_SERVE_HANG": "1" if hang else "0"},
        )
        for i, hang in enumerate(hangs, start=1)
    )
    return FleetPlan(members=members, router_argv=(), router_url="", kv_store=None)


def servers_of(fleet_plan: FleetPlan, *indexes: int) -> list[psutil.Process]:
    """Our fake servers still running on this plan's ports (of these members)."""
    ports = {str(m.port) for m in fleet_plan.members if not indexes or m.index in indexes}
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "--port" in argv and argv[argv.index("--port") + 1] in ports:
            found.append(child)
    return found


def test_a_server_whose_start_hangs_is_stopped_with_the_fleet(tmp_path):
    fleet_plan = plan(tmp_path, False, True)
    fleet = Fleet(fleet_plan, FAKE_SERVE, tmp_path)
    fleet.ready_timeout = 3
    try:
        with pytest.raises(FleetError, match="server 2: server not ready after 3 s"):
            fleet.start()
        assert servers_of(fleet_plan, 2) == []  # stopped at once: nothing on its port
        assert len(servers_of(fleet_plan, 1)) == 1  # the fleet's stop ends this one
    finally:
        fleet.stop()
    assert servers_of(fleet_plan) == []


def test_a_stop_during_a_start_is_honoured_within_seconds(tmp_path):
    fleet_plan = plan(tmp_path, True, True)
    fleet = Fleet(fleet_plan, FAKE_SERVE, tmp_path)  # the default 300 s to get ready
    threading.Timer(1.0, fleet.request_stop).start()
    started = time.monotonic()
    try:
        fleet.start()  # returns: a requested stop is no error
        assert fleet.watch() == 0
        assert time.monotonic() - started < 15
        assert servers_of(fleet_plan) == []
    finally:
        fleet.stop()
        fleet.stop()  # a second stop is a no-op


def test_a_server_that_will_not_stop_does_not_keep_the_others_running(tmp_path, monkeypatch):
    fleet_plan = plan(tmp_path, False, False)
    fleet = Fleet(fleet_plan, FAKE_SERVE, tmp_path)
    monkeypatch.setattr(router_front.RouterFront, "start", lambda *args: None)  # no vllm-router
    fleet.start()
    assert len(servers_of(fleet_plan)) == 2
    first = fleet.servers[1]
    real_stop = first.stop

    def broken_stop(*args):
        real_stop()
        raise OSError("stop failed")

    monkeypatch.setattr(first, "stop", broken_stop)
    fleet.stop()  # logs server 1's failure, stops server 2 regardless
    assert servers_of(fleet_plan) == []


class FakeRouter:
    """vllm-router's worker management, as a fleet that joins it uses it, with
    vllm-router 0.1.17's answers (measured): POST /add_worker?url=... (400
    "Worker <url> already exists" for a URL it lists) and /remove_worker?url=...
    (200 for a URL it does not list), GET /list_workers ({"urls": [...]});
    ``refuse`` (may change while it runs): 503 to everything."""

    def __init__(self, refuse: bool = False):
        import http.server
        import json
        import urllib.parse

        calls = self.calls = []
        workers = self.workers = []
        self.refuse = refuse
        router = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                path, _, query = self.path.partition("?")
                url = urllib.parse.parse_qs(query)["url"][0]
                calls.append((path, url))
                status = 503 if router.refuse else 200
                if router.refuse:
                    pass
                elif path == "/add_worker" and url in workers:
                    status = 400
                elif path == "/add_worker":
                    workers.append(url)
                elif url in workers:
                    workers.remove(url)
                body = f"Worker {url} already exists".encode() if status == 400 else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                body = json.dumps({"urls": workers}).encode()
                self.send_response(503 if router.refuse else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


def test_a_fleet_that_joins_a_router_adds_its_servers_and_removes_them_when_it_stops(tmp_path):
    router = FakeRouter()
    members = plan(tmp_path, False, False).members
    joined = FleetPlan(members, (), router.url, None, join=True)
    fleet = Fleet(joined, FAKE_SERVE, tmp_path)
    try:
        fleet.start()
        assert fleet.router is None  # no router of its own
        urls = [m.url for m in members]
        assert router.calls == [("/add_worker", u) for u in urls]
        assert joined.peer_lines == [f"{m.url}={m.events_endpoint}" for m in members]
    finally:
        fleet.stop()
        router.close()
    assert router.calls[2:] == [("/remove_worker", u) for u in urls]
    assert servers_of(joined) == []


def test_a_router_that_does_not_take_a_server_fails_the_start_with_the_reason(tmp_path):
    router = FakeRouter(refuse=True)
    joined = FleetPlan(plan(tmp_path, False).members, (), router.url, None, join=True)
    fleet = Fleet(joined, FAKE_SERVE, tmp_path)
    try:
        with pytest.raises(FleetError, match="did not take server 1"):
            fleet.start()
    finally:
        fleet.stop()
        router.close()
    assert servers_of(joined) == []


def test_a_joined_fleet_adds_its_servers_again_to_a_router_that_forgot_them(tmp_path, caplog):
    import logging

    router = FakeRouter()
    members = plan(tmp_path, False, False).members
    fleet = Fleet(FleetPlan(members, (), router.url, None, join=True), FAKE_SERVE, tmp_path)
    urls = [m.url for m in members]
    try:
        fleet.start()
        fleet.rejoin()  # listed: nothing to do
        assert router.calls == [("/add_worker", u) for u in urls]
        router.workers.clear()  # the router restarted: it forgot them
        fleet.rejoin()
        assert router.calls[2:] == [("/add_worker", u) for u in urls]
        assert sorted(router.workers) == sorted(urls)
        router.close()  # gone: said once, nothing added
        with caplog.at_level(logging.WARNING, logger=supervisor.logger.name):
            fleet.rejoin()
            fleet.rejoin()
        said = [r for r in caplog.records if "does not list its workers" in r.getMessage()]
        assert len(said) == 1
    finally:
        fleet.stop()
    assert servers_of(fleet.plan) == []


def dead_run_record(directory: Path, router_url: str, urls: list[str]) -> Path:
    """The record a joined fleet killed with SIGKILL leaves: its pid is gone."""
    import json
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: the pid names no process
    path = directory / f"joined-127.0.0.1-{router_url.rsplit(':', 1)[1]}-{gone.pid}-dead.json"
    from vllm_uma.fleet.worker_record import this_host

    record = {"router": router_url, "host": this_host(), "pid": gone.pid, "started": 1.0}
    path.write_text(json.dumps({**record, "urls": urls}))
    return path


def test_a_joined_fleet_takes_back_what_a_killed_run_left_before_adding_its_own(tmp_path):
    router = FakeRouter()
    stale = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    router.workers.extend(stale)  # a run killed with SIGKILL never removed them
    left = dead_run_record(tmp_path, router.url, stale)
    members = plan(tmp_path, False, False).members
    fleet = Fleet(
        FleetPlan(members, (), router.url, None, join=True), FAKE_SERVE, tmp_path, tmp_path
    )
    urls = [m.url for m in members]
    try:
        fleet.start()
        assert router.calls == [("/remove_worker", u) for u in stale] + [
            ("/add_worker", u) for u in urls
        ]
        assert router.workers == urls and not left.exists()
        (ours,) = tmp_path.glob("joined-*.json")  # this run's, for a next start after a crash
        assert sorted(json.loads(ours.read_text())["urls"]) == sorted(urls)
    finally:
        fleet.stop()
        router.close()
    assert router.workers == [] and list(tmp_path.glob("joined-*.json")) == []


def test_a_dead_runs_urls_wait_for_a_router_that_did_not_answer(tmp_path):
    router = FakeRouter(refuse=True)
    left = dead_run_record(tmp_path, router.url, ["http://127.0.0.1:1"])
    router.workers.append("http://127.0.0.1:1")
    members = plan(tmp_path, False).members
    fleet = Fleet(
        FleetPlan(members, (), router.url, None, join=True), FAKE_SERVE, tmp_path, tmp_path
    )
    try:
        with pytest.raises(FleetError, match="did not take server 1"):
            fleet.start()
        assert left.exists()  # kept: tried again
        router.refuse = False
        fleet.rejoin()  # the router answers again: the dead run's URL goes
        assert not left.exists() and "http://127.0.0.1:1" not in router.workers
    finally:
        fleet.stop()
        router.close()


def test_a_stop_the_router_did_not_hear_keeps_the_record(tmp_path):
    router = FakeRouter()
    members = plan(tmp_path, False).members
    fleet = Fleet(
        FleetPlan(members, (), router.url, None, join=True), FAKE_SERVE, tmp_path, tmp_path
    )
    try:
        fleet.start()
        router.refuse = True  # gone quiet: our servers stay listed there
    finally:
        fleet.stop()
    (kept,) = tmp_path.glob("joined-*.json")
    router.refuse = False
    again = Fleet(FleetPlan(plan(tmp_path, False).members, (), router.url, None, join=True),
                  FAKE_SERVE, tmp_path, tmp_path)  # fmt: skip
    try:
        again.start()  # this process is alive: the record of a live run is never taken
        assert members[0].url in router.workers and kept.exists()
    finally:
        again.stop()
        router.close()


def test_a_url_the_router_lists_already_counts_as_added(tmp_path):
    router = FakeRouter()
    members = plan(tmp_path, False).members
    router.workers.append(members[0].url)  # added by a run whose record was lost
    fleet = Fleet(FleetPlan(members, (), router.url, None, join=True), FAKE_SERVE, tmp_path)
    try:
        fleet.start()  # vllm-router answers 400 "already exists": no failure
        assert router.workers == [members[0].url]
    finally:
        fleet.stop()
        router.close()


class RealRouter:
    """vllm-router itself (installed with vllm-uma), on a free loopback port,
    tied to this process as the fleet ties its own."""

    def __init__(self, log: Path):
        import os
        import subprocess

        import requests

        from vllm_uma.lifeline import shim_command, supervised_env

        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [*router_front.router_command(), "--host", "127.0.0.1", "--port",
                self.url.rsplit(":", 1)[1], "--policy", "round_robin",
                "--prometheus-port", str(free_port())]  # fmt: skip
        self._log = open(log, "w")
        self.proc = subprocess.Popen(
            shim_command(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **supervised_env()},
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/health", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise AssertionError(f"vllm-router did not start: {log.read_text()[-2000:]}")

    def workers(self) -> list[str]:
        import requests

        return sorted(requests.get(f"{self.url}/list_workers", timeout=5).json()["urls"])

    def close(self):
        router_front.stop_router(self.proc)
        self._log.close()


def test_no_url_of_a_killed_server_or_fleet_stays_in_vllm_routers_rotation(tmp_path):
    """With vllm-router itself: a server killed with SIGKILL is listed once
    when the fleet has restarted it; a joined fleet killed with SIGKILL
    leaves its URLs listed (vllm-router keeps a dead worker), and the next
    fleet started on this host removes them before adding its own."""
    import signal
    import subprocess

    router = RealRouter(tmp_path / "router.log")
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    killed_ports = [free_port(), free_port()]
    first = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fake_fleet.py")), router.url,
         str(records), str(tmp_path), *map(str, killed_ports)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    fleet = watching = None
    try:
        assert first.stdout.readline().strip() == "ready"
        killed = sorted(f"http://127.0.0.1:{p}" for p in killed_ports)
        assert router.workers() == killed
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert router.workers() == killed  # what the fleet never removed

        members = plan(tmp_path, False, False).members
        joined = FleetPlan(members, (), router.url, None, join=True)
        fleet = Fleet(joined, FAKE_SERVE, tmp_path, records)
        fleet.start()
        urls = sorted(m.url for m in members)
        assert router.workers() == urls  # the killed run's are gone

        # One of ours killed with SIGKILL: restarted on its port, listed once.
        watching = threading.Thread(target=fleet.watch)
        watching.start()
        dead = fleet.servers[1].proc
        os.killpg(dead.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while fleet.servers[1].proc is dead and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.servers[1].proc is not dead, "the fleet did not restart server 1"
        assert router.workers() == urls
    finally:
        if first.poll() is None:
            first.kill()
        if fleet is not None:
            fleet.request_stop()
            if watching is not None:
                watching.join(timeout=10)
            fleet.stop()
        router.close()
    assert list(records.iterdir()) == []  # a clean stop leaves no record
