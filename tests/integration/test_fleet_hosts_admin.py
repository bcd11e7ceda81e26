"""Who can steer a fleet across hosts (issue 44, items 2 and 4), on simulated
hosts (tools/hosts: network namespaces on a bridge) with vllm-router itself.

Host 1 runs a fleet with its router (the supervisor's own, gate included);
host 2 a fleet that joins it with the fleet's API key; host 3 is a client.
The servers are tests/integration/keyed_serve.py: the real server guard in front
of a stand-in app (no vLLM), on each host's address.

- the fleet's host adds its server, and removes it when it stops;
- the client can neither add, remove nor list workers, and still gets
  /v1/models through the router; the router's own port is not reachable;
- a host with another key cannot join;
- a server on --advertise refuses the client without the key (but /health).

Needs root and iproute2, as test_hosts_netns.py, and fails rather than
skips where simulated hosts cannot be made.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import requests

from tools.hosts import Network
from tools.hosts.ipcmd import HostsError
from vllm_uma.fleet.api_key import generate_key_file, read_key_file
from vllm_uma.fleet.plan import FleetRequest, plan_fleet
from vllm_uma.fleet.supervisor import Fleet, FleetError
from vllm_uma.server_process import free_port

KEYED_SERVE = [sys.executable, str(Path(__file__).with_name("keyed_serve.py"))]
ROUTER_PORT = 8000  # a fresh namespace: every port is free


def fleet_on(net: Network, i: int, work: Path, key_file: Path, join: str | None = None) -> Fleet:
    """A fleet of one stand-in server on host ``i``: made and started in that
    host's thread, so that everything it starts listens and connects there."""
    address = net.host(i).address
    ask = FleetRequest(
        servers=1, model="stand-in", serve_flags=(), host=address, port=ROUTER_PORT,
        policy="round_robin", kv_store=None, events_dir=work, metrics_port=free_port(),
        advertise=address, join=join, api_key_file=key_file,
    )  # fmt: skip
    records = work / f"records-{i}"
    records.mkdir(mode=0o700, exist_ok=True)

    def start() -> Fleet:
        fleet = Fleet(plan_fleet(ask, [0], free_port), KEYED_SERVE, work, records)
        try:
            fleet.start()
        except BaseException:
            fleet.stop()
            raise
        return fleet

    return net.on(i).submit(start).result()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    work = tmp_path_factory.mktemp("hosts-admin")
    key_file = work / "fleet-api.key"  # every host's copy of the fleet's key
    generate_key_file(key_file)
    try:
        net = Network(3).up()
    except HostsError as e:
        pytest.fail(f"this machine cannot make simulated hosts: {e}", pytrace=False)
    fleets = {}
    try:
        fleets[1] = fleet_on(net, 1, work, key_file)
        router = fleets[1].plan.router_url
        fleets[2] = fleet_on(net, 2, work, key_file, join=router)
        yield {"net": net, "fleets": fleets, "router": router, "keys": read_key_file(key_file),
               "work": work}  # fmt: skip
    finally:
        for i, fleet in fleets.items():
            net.on(i).submit(fleet.stop).result()
        net.down()


def on(hosts, i: int, fn, *args):
    return hosts["net"].on(i).submit(fn, *args).result()


def listed(hosts) -> list[str]:
    """The router's workers, asked on host 1's loopback (the supervisor's way)."""
    admin = hosts["fleets"][1].plan.admin_url
    return on(hosts, 1, lambda: sorted(requests.get(f"{admin}/list_workers", timeout=5)
                                       .json()["urls"]))  # fmt: skip


def server_url(hosts, i: int) -> str:
    return hosts["fleets"][i].plan.members[0].url


def test_a_fleet_host_adds_its_server_with_the_fleets_key(hosts):
    assert server_url(hosts, 2).startswith(f"http://{hosts['net'].host(2).address}:")
    assert listed(hosts) == sorted([server_url(hosts, 1), server_url(hosts, 2)])


def test_a_client_host_cannot_add_remove_or_list_workers_and_is_still_served(hosts):
    router, before = hosts["router"], listed(hosts)
    mine = f"http://{hosts['net'].host(3).address}:9999"

    def ask(method: str, path: str, headers=None) -> requests.Response:
        return requests.request(method, router + path, headers=headers, timeout=10)

    admin = [("POST", f"/add_worker?url={mine}"),
             ("POST", f"/remove_worker?url={server_url(hosts, 2)}"),
             ("DELETE", f"/workers/{server_url(hosts, 1)}"), ("GET", "/list_workers")]  # fmt: skip
    for method, path in admin:
        for auth in ({}, {"Authorization": "Bearer " + "x" * 64}):
            reply = on(hosts, 3, ask, method, path, auth)
            assert reply.status_code == 403, (path, reply.text)
    assert listed(hosts) == before
    models = on(hosts, 3, ask, "GET", "/v1/models")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "stand-in"
    # The router itself listens on host 1's loopback only: host 3 reaches the gate alone.
    internal_port = int(hosts["fleets"][1].plan.admin_url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        on(hosts, 3, socket.create_connection, (hosts["net"].host(1).address, internal_port), 3)


def test_a_host_with_another_key_cannot_join(hosts, tmp_path, caplog):
    other = tmp_path / "other.key"
    generate_key_file(other)
    with pytest.raises(FleetError, match="did not take server 1"):
        fleet_on(hosts["net"], 3, hosts["work"], other, join=hosts["router"])
    assert "copy the router host's file here" in caplog.text
    assert len(listed(hosts)) == 2


def test_a_server_on_advertise_refuses_a_client_without_the_key(hosts):
    url, key = server_url(hosts, 2), hosts["keys"].header()

    def status(method: str, path: str, headers=None) -> int:
        return requests.request(method, url + path, headers=headers, timeout=10).status_code

    paths = [("GET", "/v1/models"), ("POST", "/tokenize"), ("POST", "/abort_requests"),
             ("POST", "/v1/chat/completions")]  # fmt: skip
    for method, path in paths:
        assert on(hosts, 3, status, method, path) == 401, path
        assert on(hosts, 3, status, method, path, key) == 200, path  # the key, not the network
    assert on(hosts, 3, status, "GET", "/health") == 200  # the router's health checks


def test_a_fleet_host_removes_its_server_when_it_stops(hosts):
    fleets = hosts["fleets"]
    on(hosts, 2, fleets.pop(2).stop)
    assert listed(hosts) == [server_url(hosts, 1)]
