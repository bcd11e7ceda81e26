"""The fleet's gate and API key on one host (vllm_uma/fleet/gate.py,
router_main.py, the supervisor), with vllm-router itself: a fleet of the
supervisor's own making, its servers tests/integration/keyed_serve.py (the
real server guard in front of a stand-in app, no vLLM), everything on loopback.

- a client reaches /v1/*, /health and /metrics, and its request reaches a
  server with the fleet's key in place of its own;
- the router's worker administration takes the fleet's key, and nothing
  else; other paths never reach a server;
- the router's own calls carry the key, which no process shows on its
  command line or in its environment;
- with --client-key-file, a client needs a key.
The same across simulated hosts: test_fleet_hosts_admin.py. The gate alone
(a streamed reply, a busy --port): tests/unit/test_fleet_gate_alone.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
import requests

from vllm_uma.fleet.api_key import generate_key_file, read_key_file
from vllm_uma.fleet.gate import Gate
from vllm_uma.fleet.plan import FleetRequest, plan_fleet
from vllm_uma.fleet.supervisor import Fleet
from vllm_uma.server_process import Server, free_port

KEYED_SERVE = [sys.executable, str(Path(__file__).with_name("keyed_serve.py"))]
CLIENT_KEY = "c" * 64


def fleet_request(work: Path, key_file: Path, port: int) -> FleetRequest:
    return FleetRequest(
        servers=1, model="stand-in", serve_flags=(), host="127.0.0.1", port=port,
        policy="round_robin", kv_store=None, events_dir=work, metrics_port=free_port(),
        api_key_file=key_file,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("gate")
    key_file = work / "fleet-api.key"
    generate_key_file(key_file)
    plan = plan_fleet(fleet_request(work, key_file, free_port()), [0], free_port)
    running = Fleet(plan, KEYED_SERVE, work)
    try:
        running.start()
        yield {"fleet": running, "plan": plan, "keys": read_key_file(key_file), "work": work}
    finally:
        running.stop()


def workers(fleet) -> list[str]:
    """What the router lists, asked on its own loopback port (the supervisor's way)."""
    reply = requests.get(f"{fleet['plan'].admin_url}/list_workers", timeout=5)
    return sorted(reply.json()["urls"])


def test_a_client_reaches_v1_health_and_metrics_and_its_request_carries_the_fleets_key(fleet):
    gate = fleet["plan"].router_url
    # The client's own Authorization is replaced: the server takes the fleet's key only.
    for auth in ({}, {"Authorization": f"Bearer {CLIENT_KEY}"}):
        reply = requests.get(f"{gate}/v1/models", headers=auth, timeout=10)
        assert reply.status_code == 200, reply.text
        assert reply.json()["data"][0]["id"] == "stand-in"
        reply = requests.post(f"{gate}/v1/completions/render", json={}, headers=auth, timeout=10)
        assert reply.json() == {"path": "/v1/completions/render", "method": "POST"}
    assert requests.get(f"{gate}/health", timeout=10).status_code == 200
    assert "a stand-in's metrics" in requests.get(f"{gate}/metrics", timeout=10).text


def test_the_routers_administration_takes_the_fleets_key_and_nothing_else(fleet, tmp_path):
    gate, keys = fleet["plan"].router_url, fleet["keys"]
    listed = workers(fleet)
    extra = Server(KEYED_SERVE, ["--api-key-file", str(keys.source)], tmp_path / "extra.log")
    try:
        extra.wait_ready(30)
        for auth in ({}, {"Authorization": f"Bearer {CLIENT_KEY}"}, {"Authorization": "Basic x"}):
            for method, path in (("POST", f"/add_worker?url={extra.url}"), ("GET", "/list_workers"),
                                 ("POST", f"/remove_worker?url={listed[0]}"), ("GET", "/workers"),
                                 ("DELETE", f"/workers/{listed[0]}"), ("POST", "/flush_cache"),
                                 ("GET", "/get_loads")):  # fmt: skip
                reply = requests.request(method, gate + path, headers=auth, timeout=10)
                assert reply.status_code == 403, (path, auth, reply.text)
                assert "only the fleet's hosts may" in reply.json()["error"]
        assert workers(fleet) == listed  # nothing added, nothing removed
        with_key = keys.header()
        reply = requests.post(f"{gate}/add_worker", params={"url": extra.url}, headers=with_key,
                              timeout=30)  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert workers(fleet) == sorted([*listed, extra.url])
        reply = requests.get(f"{gate}/list_workers", headers=with_key, timeout=10)
        assert sorted(reply.json()["urls"]) == workers(fleet)
        requests.post(f"{gate}/remove_worker", params={"url": extra.url}, headers=with_key,
                      timeout=10).raise_for_status()  # fmt: skip
        assert workers(fleet) == listed
    finally:
        extra.stop()


@pytest.mark.parametrize(
    "method, path",
    [("POST", "/tokenize"), ("POST", "/abort_requests"), ("POST", "/inference/v1/generate"),
     ("POST", "/v1/load_lora_adapter"), ("GET", "/kv_event_sources"), ("GET", "/"),
     ("GET", "/healthz"), ("GET", "/v1")],
)  # fmt: skip
def test_other_paths_are_refused_at_the_gate(fleet, method, path):
    # vllm-router would pass each to a server with its own key (its transparent proxy).
    reply = requests.request(method, fleet["plan"].router_url + path, timeout=10)
    assert reply.status_code == 404
    assert "is not served here" in reply.json()["error"]


def test_the_routers_own_calls_carry_the_key_no_process_shows(fleet):
    # Straight to the router: a path it proxies as it is, with its --api-key (router_main.py).
    reply = requests.post(f"{fleet['plan'].admin_url}/tokenize", json={}, timeout=10)
    assert reply.status_code == 200 and reply.json()["path"] == "/tokenize", reply.text
    key = fleet["keys"].sent
    seen = 0
    for child in psutil.Process().children(recursive=True):
        try:
            argv, environ = " ".join(child.cmdline()), child.environ()
        except psutil.NoSuchProcess:
            continue
        seen += 1
        assert key not in argv, argv
        assert not any(key in value for value in environ.values()), argv
    assert seen >= 3  # the router's shim, the router, the server


def test_with_client_keys_a_client_needs_one(fleet, tmp_path):
    client_file = tmp_path / "clients.key"
    client_file.write_text(CLIENT_KEY + "\n")
    client_file.chmod(0o600)
    gate = Gate("127.0.0.1", free_port(), fleet["plan"].admin_url, fleet["keys"],
                read_key_file(client_file, "--client-key-file"))  # fmt: skip
    try:
        as_client = {"Authorization": f"Bearer {CLIENT_KEY}"}
        for path in ("/v1/models", "/metrics"):
            for auth in ({}, {"Authorization": "Bearer " + "x" * 64}):
                reply = requests.get(gate.url + path, headers=auth, timeout=10)
                assert reply.status_code == 401 and "--client-key-file" in reply.text
            assert requests.get(gate.url + path, headers=as_client, timeout=10).status_code == 200
        fleets = fleet["keys"].header()
        assert requests.get(f"{gate.url}/v1/models", headers=fleets, timeout=10).status_code == 200
        assert requests.get(f"{gate.url}/health", timeout=10).status_code == 200
        reply = requests.get(f"{gate.url}/list_workers", headers=as_client, timeout=10)
        assert reply.status_code == 403  # a client's key is not the fleet's
    finally:
        gate.stop()
