"""`vllm-uma fleet`'s plan (vllm_uma/fleet/plan.py): shares, flags, router."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pytest

from vllm_uma.fleet.plan import FleetPlanError, FleetRequest, Peer, cores_for, plan_fleet


def ask(**kw) -> FleetRequest:
    base = dict(
        servers=2, model="/models/m", serve_flags=(), host="127.0.0.1", port=8000,
        policy="kv_aware", kv_store=Path("/var/kv"), events_dir=Path("/run/user/0/vllm-uma"),
    )  # fmt: skip
    return FleetRequest(**{**base, **kw})


def ports():
    counter = itertools.count(9001)
    return lambda: next(counter)


def flag(argv, name):
    argv = list(argv)
    return argv[argv.index(name) + 1]


def test_cores_are_split_into_disjoint_ranges_the_first_taking_the_rest():
    assert cores_for(2, [0, 1]) == [(0,), (1,)]
    assert cores_for(3, list(range(8))) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    with pytest.raises(FleetPlanError, match="--servers 3 needs at least 3 CPU cores.*0-1"):
        cores_for(3, [0, 1])


def test_each_server_gets_its_share_and_its_own_port_socket_and_membership():
    plan = plan_fleet(ask(serve_flags=("--dtype", "float32")), [0, 1, 2, 3], ports())
    sockets = "ipc:///run/user/0/vllm-uma/fleet-127.0.0.1-8000-server-{}.sock"
    assert [(m.port, m.events_in, m.events_out_port) for m in plan.members] == [
        (9001, sockets.format(1), 9002), (9003, sockets.format(2), 9004)]  # fmt: skip
    assert [m.env["VLLM_CPU_OMP_THREADS_BIND"] for m in plan.members] == ["0-1", "2-3"]
    for i, member in enumerate(plan.members, start=1):
        argv = member.argv
        assert flag(argv, "--dtype") == "float32"  # the user's flags reach every server
        assert flag(argv, "--gpu-memory-utilization") == "0.4500"  # 0.9 / 2
        uma = json.loads(flag(argv, "--additional-config"))["vllm_uma"]
        assert uma == {"fleet_member": i, "fleet_size": 2}
        events = json.loads(flag(argv, "--kv-events-config"))
        assert events["endpoint"] == member.events_in  # vLLM binds it: this user only
        assert events["topic"] == ""  # the only topic vllm-router 0.1.17 reads
        # With the shared store the pool is the disk tier's staging area:
        # the connector named without a size, the server sizes it.
        assert "--kv-offloading-size" not in argv
        assert "--enable-scale-out" in argv  # the router renders requests into tokens
        transfer = json.loads(flag(argv, "--kv-transfer-config"))
        assert transfer["kv_connector"] == "OffloadingConnector"
        tiers = transfer["kv_connector_extra_config"]
        assert tiers["secondary_tiers"] == [{"type": "fs", "root_dir": "/var/kv"}]
        assert tiers["self_describing_kv_events"] is True  # pool/disk events placeable


def test_without_a_store_each_server_gets_a_one_gib_pool():
    member = plan_fleet(ask(kv_store=None), [0, 1], ports()).members[0]
    assert flag(member.argv, "--kv-offloading-size") == "1.0"
    assert 'kv_connector"' not in flag(member.argv, "--kv-transfer-config")


def test_a_pool_size_the_user_gives_is_kept_beside_the_store():
    member = plan_fleet(ask(serve_flags=("--kv-offloading-size", "2")), [0, 1], ports()).members[0]
    assert flag(member.argv, "--kv-offloading-size") == "2"
    transfer = json.loads(flag(member.argv, "--kv-transfer-config"))
    assert "kv_connector" not in transfer  # vLLM names it from the size
    assert transfer["kv_connector_extra_config"]["secondary_tiers"][0]["root_dir"] == "/var/kv"


def test_the_router_subscribes_to_every_server_with_the_cpu_block_size():
    plan = plan_fleet(ask(), [0, 1], ports())
    argv = list(plan.router_argv)
    assert flag(argv, "--policy") == "kv_aware"
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-source"]
    assert sources == [
        "http://127.0.0.1:9001=tcp://127.0.0.1:9002",
        "http://127.0.0.1:9003=tcp://127.0.0.1:9004",
    ]
    # The servers' block: vllm-uma's default (plugin/block_size.py).
    assert flag(argv, "--kv-event-block-size") == "32" and plan.block_tokens == 32
    assert flag(argv, "--kv-event-model") == "/models/m"
    assert (
        "--kv-event-source"
        not in plan_fleet(ask(policy="round_robin"), [0, 1], ports()).router_argv
    )


@pytest.mark.parametrize("flags", [("--block-size", "128"), ("--block-size=128",)])
def test_the_router_hashes_the_block_size_the_servers_are_given(flags):
    plan = plan_fleet(ask(serve_flags=flags), [0, 1], ports())
    assert flag(list(plan.router_argv), "--kv-event-block-size") == "128"
    assert plan.block_tokens == 128
    assert "".join(flags) in "".join(plan.members[0].argv)  # the servers get it too


@pytest.mark.parametrize("value", ["48", "0", "big"])
def test_a_block_size_vllm_cpu_cannot_serve_is_refused_with_the_rule(value):
    with pytest.raises(FleetPlanError) as err:
        plan_fleet(ask(serve_flags=("--block-size", value)), [0, 1], ports())
    assert str(err.value).startswith(f"--block-size {value!r}: vLLM CPU's attention takes")


def test_the_users_utilization_and_additional_config_are_shared_not_lost():
    flags = ("--gpu-memory-utilization=0.6", "--additional-config",
             '{"vllm_uma": {"wire_weights": false}, "other": 1}')  # fmt: skip
    member = plan_fleet(ask(serve_flags=flags), [0, 1], ports()).members[1]
    assert flag(member.argv, "--gpu-memory-utilization") == "0.3000"
    config = json.loads(flag(member.argv, "--additional-config"))
    assert config == {"other": 1, "vllm_uma": {"wire_weights": False, "fleet_member": 2,
                                               "fleet_size": 2}}  # fmt: skip
    assert list(member.argv).count("--additional-config") == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--port", "9"), "--port is set by `vllm-uma fleet`"),
        (("--kv-events-config={}",), "--kv-events-config is set by"),
        (("--gpu-memory-utilization", "1.5"), "must be in \\(0, 1\\]"),
        (("--additional-config", "[1]"), "must be a JSON object"),
        (("--kv-transfer-config", "{}"), "remove one"),
        (("--api-key", "k" * 40), "--api-key: .* fleet's own --api-key-file"),
        (("--api-key-file=/k",), "--api-key-file: .*remove --api-key-file"),
    ],
)
def test_flags_the_fleet_owns_or_cannot_share_are_refused_with_the_fix(flags, message):
    with pytest.raises(FleetPlanError, match=message):
        plan_fleet(ask(serve_flags=flags), [0, 1], ports())


def test_without_a_store_the_users_offloading_flags_are_kept():
    member = plan_fleet(ask(kv_store=None, serve_flags=("--kv-offloading-size", "2")), [0, 1],
                        ports()).members[0]  # fmt: skip
    assert flag(member.argv, "--kv-offloading-size") == "2"
    extra = json.loads(flag(member.argv, "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra == {"self_describing_kv_events": True}  # no disk tier


def test_the_users_own_transfer_config_is_kept_as_given_without_a_store():
    mine = '{"kv_connector_extra_config": {"store_threshold": 2}}'
    flags = ("--kv-offloading-size", "2", "--kv-transfer-config", mine)
    member = plan_fleet(ask(kv_store=None, serve_flags=flags), [0, 1], ports()).members[0]
    assert [a for a in member.argv if a.startswith("{")].count(mine) == 1
    assert member.argv.count("--kv-transfer-config") == 1


def test_the_relay_passes_placeable_events_and_drops_the_rest_keeping_the_sequence(tmp_path):
    import time

    import msgspec
    import zmq

    from vllm_uma.fleet.relay import EventRelay
    from vllm_uma.server_process import free_port

    stored = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
              "token_ids": list(range(4)), "block_size": 4, "medium": "GPU"}  # fmt: skip
    placeholder = {**stored, "token_ids": [], "block_size": 0, "medium": "STORAGE"}
    batch = msgspec.msgpack.encode([1.0, [stored, placeholder], None])
    ctx = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    relay = EventRelay(ctx, f"ipc://{tmp_path}/s.sock", free_port(), block_tokens=4, name="1")
    pub.bind(relay.inbound)  # as vLLM does with an ipc:// endpoint, after the relay starts
    sub.connect(relay.outbound)  # as vllm-router does
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    seq = (5).to_bytes(8, "big")
    got = None
    for _ in range(50):  # PUB/SUB drops what is sent before the subscription arrives
        pub.send_multipart([b"", seq, batch])
        try:
            got = sub.recv_multipart()
            break
        except zmq.Again:
            time.sleep(0.05)
    assert got is not None and got[:2] == [b"", seq]
    assert msgspec.msgpack.decode(got[2]) == [1.0, [stored], None]
    assert sum(relay.dropped.values()) >= 1 and all("token ids" in r for r in relay.dropped)
    pub.send_multipart([b"", b"other"])  # not vLLM's shape: the router's to judge
    assert sub.recv_multipart() == [b"", b"other"]
    relay.stop()
    for sock in (pub, sub):
        sock.close(linger=0)
    ctx.term()


@pytest.mark.parametrize(
    "argv, present",
    [
        (("--served-model-name", "m"), True),
        (("--served-model-name=m",), True),
        (("--served-model-names", "m"), False),  # another flag with that prefix
        (("--dtype", "--served-model-name"), True),
        ((), False),
    ],
)
def test_fleet_and_serve_read_a_flags_presence_through_one_function(argv, present):
    """The fleet keeps a flag it finds given, and serve honours the same flag,
    both through commands/argv.given: they cannot disagree on the forms."""
    from vllm_uma.commands import argv as shared
    from vllm_uma.commands import serve
    from vllm_uma.fleet import plan

    assert plan.given is shared.given and serve.given is shared.given
    assert shared.given(argv, "--served-model-name") is present
    # serve names the served model after the recipe unless the same flag is given.
    args = argparse.Namespace(served_model_name=None, model_tag=None, model="/m")
    serve.apply_defaults(args, list(argv), recipe="SmolLM2-135M-Instruct")
    assert (args.served_model_name is None) is present


def test_a_flag_without_its_value_is_refused_by_the_fleet():
    with pytest.raises(FleetPlanError, match="--additional-config needs a value"):
        plan_fleet(ask(serve_flags=("--additional-config",)), [0, 1], ports())


def test_an_events_directory_too_deep_for_a_unix_socket_is_refused_with_the_fix():
    deep = Path("/") / ("d" * 100)
    with pytest.raises(FleetPlanError, match=r"characters long, over the 107.*VLLM_UMA_CACHE_DIR"):
        plan_fleet(ask(events_dir=deep), [0, 1], ports())


def test_one_host_of_several_advertises_its_address_for_servers_and_events():
    plan = plan_fleet(ask(advertise="10.0.0.5"), [0, 1], ports())
    assert [m.url for m in plan.members] == ["http://10.0.0.5:9001", "http://10.0.0.5:9003"]
    assert plan.peer_lines == [
        "http://10.0.0.5:9001=tcp://10.0.0.5:9002",
        "http://10.0.0.5:9003=tcp://10.0.0.5:9004",
    ]
    assert flag(plan.router_argv, "--worker-urls") == "http://10.0.0.5:9001"


def test_a_router_routes_to_the_peers_of_other_hosts_with_their_events():
    peers = (Peer.parse("http://10.0.0.6:9001=tcp://10.0.0.6:9002"), Peer.parse("http://h7:80"))
    argv = list(plan_fleet(ask(servers=1, peers=peers), [0, 1], ports()).router_argv)
    workers = argv[argv.index("--worker-urls") + 1 : argv.index("--prometheus-host")]
    assert workers == ["http://127.0.0.1:9001", "http://10.0.0.6:9001", "http://h7:80"]
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-source"]
    # A peer without its events is routed by load alone: no source for it.
    assert sources == [
        "http://127.0.0.1:9001=tcp://127.0.0.1:9002",
        peers[0].url + "=" + peers[0].events,
    ]


@pytest.mark.parametrize(
    "text", ["10.0.0.6:9001", "http://h:80=h:81", "http://h/x:80", "ftp://h:1"]
)
def test_a_peer_not_in_the_form_join_prints_is_refused_with_the_form(text):
    with pytest.raises(FleetPlanError, match="http://HOST:PORT"):
        Peer.parse(text)


def test_a_fleet_that_joins_another_router_starts_none_and_takes_no_peers():
    plan = plan_fleet(ask(join="http://10.0.0.1:8000/", advertise="10.0.0.5"), [0, 1], ports())
    assert plan.join and plan.router_argv == () and plan.router_url == "http://10.0.0.1:8000"
    with pytest.raises(FleetPlanError, match="--peer and --join"):
        plan_fleet(ask(join="http://10.0.0.1:8000", peers=(Peer("http://h:1"),)), [0, 1], ports())


def test_the_network_tier_goes_after_the_disk_store_or_alone():
    def tiers(**kw):
        argv = plan_fleet(ask(**kw), [0, 1], ports()).members[0].argv
        config = json.loads(flag(argv, "--kv-transfer-config"))
        return config, [t["type"] for t in config["kv_connector_extra_config"]["secondary_tiers"]]

    secret = dict(network_secret_file=Path("/k/kv-network.secret"))
    config, kinds = tiers(network_url="valkey://10.0.0.9:6379/0", **secret)
    assert kinds == ["fs", "valkey"]
    assert config["kv_connector"] == "OffloadingConnector"  # the pool: their staging area
    config, kinds = tiers(network_url="valkey://10.0.0.9:6379/0", kv_store=None, **secret)
    assert kinds == ["valkey"] and "kv_connector" in config
    argv = (
        plan_fleet(ask(network_url="valkey://h:1/0", kv_store=None, **secret), [0, 1], ports())
        .members[0]
        .argv
    )
    assert "--kv-offloading-size" not in argv  # no 1 GiB pool: the staging pool
    with pytest.raises(FleetPlanError, match="--kv-network"):
        plan_fleet(
            ask(
                network_url="valkey://h:1/0",
                kv_store=None,
                serve_flags=("--kv-transfer-config", "{}"),
            ),
            [0, 1],
            ports(),
        )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--advertise", "host-a"], "is not an IP address"),
        (["--advertise", "0.0.0.0"], "one IPv4 address of this host"),
        (["--advertise", "::1"], "one IPv4 address of this host"),
        (["--advertise", "192.0.2.77"], "this host cannot listen there"),  # TEST-NET-1
        (["--join", "http://10.0.0.1:8000"], "add --advertise"),
        (["--advertise", "127.0.0.1", "--join", "10.0.0.1:8000"], "router's http://HOST:PORT"),
        (["--kv-network", "valkey://user:secret@h:6379/0"], "--kv-network"),
    ],
)
def test_the_flags_of_one_host_of_several_are_checked_with_the_fix(argv, message):
    from vllm_uma.commands.fleet import build_parser, check_hosts_flags

    problem = check_hosts_flags(build_parser().parse_args(argv))
    assert problem is not None and message in problem, problem
    assert "secret" not in problem
    assert check_hosts_flags(build_parser().parse_args(["--advertise", "127.0.0.1"])) is None


def test_fleets_that_join_a_router_name_their_event_sockets_by_their_servers_ports():
    # No router here holds an address: two such fleets on one host must not
    # share (and remove) each other's sockets.
    a = plan_fleet(ask(join="http://10.0.0.1:8000", advertise="10.0.0.5"), [0, 1], ports())
    b_ports = itertools.count(9101)
    b = plan_fleet(
        ask(join="http://10.0.0.1:8000", advertise="10.0.0.5"), [0, 1], lambda: next(b_ports)
    )
    sockets = [m.events_in for m in (*a.members, *b.members)]
    assert len(set(sockets)) == 4
    assert sockets[0].endswith("fleet-joined-10.0.0.5-9001.sock")


def test_the_fleets_shared_tiers_are_refused_where_weights_can_change(tmp_path):
    from vllm_uma.commands.fleet import check_weight_updates

    dev = {"VLLM_SERVER_DEV_MODE": "1"}
    problem = check_weight_updates(tmp_path, None, False, dev)
    assert problem.startswith("VLLM_SERVER_DEV_MODE=1 opens vLLM's development endpoints")
    assert problem.endswith("or start the fleet with --kv-store none and without --kv-network.")
    problem = check_weight_updates(None, "valkey://10.0.0.3:6379/0", True, {})
    assert "the network tier would keep serving" in problem
    assert check_weight_updates(None, None, True, dev) is None  # host pools only
    assert check_weight_updates(tmp_path, None, False, {}) is None


def test_the_network_tier_signs_with_the_fleet_secret_named_never_given(tmp_path):
    secret = tmp_path / "kv-network.secret"
    request = ask(network_url="valkey://10.0.0.9:6379/0", network_secret_file=secret)
    for member in plan_fleet(request, [0, 1], ports()).members:
        config = json.loads(flag(member.argv, "--kv-transfer-config"))
        (network,) = [
            t for t in config["kv_connector_extra_config"]["secondary_tiers"] if t["type"] != "fs"
        ]
        assert network == {"type": "valkey", "url": request.network_url, "secret_file": str(secret)}
    with pytest.raises(FleetPlanError, match="--kv-secret-file PATH"):
        plan_fleet(ask(network_url="valkey://10.0.0.9:6379/0"), [0, 1], ports())


def test_the_fleet_creates_its_secret_once_and_refuses_one_others_can_read(tmp_path, capsys):
    from vllm_uma.commands.fleet import fleet_secret
    from vllm_uma.kv_offload import mac_keys

    path = tmp_path / "private" / "kv-network.secret"
    assert fleet_secret(path) is None
    key = path.read_text()
    said = capsys.readouterr().err
    key_id = mac_keys.read_file(str(path)).signing.id.hex()
    assert f"created {path} with a new key (id {key_id})" in said and "copy it" in said
    assert key.strip() not in said  # the key itself is never printed
    assert fleet_secret(path) is None and path.read_text() == key  # kept: every host's
    assert capsys.readouterr().err == ""
    path.chmod(0o644)
    assert "has mode 0644" in fleet_secret(path)


def test_clients_reach_the_gate_and_the_router_listens_on_loopback_only():
    # The router's own port is on 127.0.0.1: only the gate (fleet/gate.py)
    # faces --host, and the fleet administers the router on loopback.
    plan = plan_fleet(ask(host="10.0.0.1", port=8000), [0, 1], ports())
    argv = list(plan.router_argv)
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "9005"
    assert (plan.gate.host, plan.gate.port) == ("10.0.0.1", 8000)
    assert plan.router_url == "http://10.0.0.1:8000"
    assert plan.admin_url == "http://127.0.0.1:9005"


def test_every_server_and_the_router_name_the_key_file_never_the_key(tmp_path):
    from vllm_uma.fleet.api_key import generate_key_file, read_key_file

    key_file = tmp_path / "fleet-api.key"
    generate_key_file(key_file)
    key = read_key_file(key_file).sent
    plan = plan_fleet(ask(api_key_file=key_file), [0, 1], ports())
    for member in plan.members:
        assert flag(member.argv, "--api-key-file") == str(key_file)
        assert "--api-key" not in member.argv
    assert plan.api_key_file == key_file
    everything = [*plan.router_argv, *(a for m in plan.members for a in m.argv)]
    everything += [v for m in plan.members for v in m.env.values()]
    assert not any(key in word for word in everything)
    # Without a file (the fleet benchmark) no server is given a key.
    assert "--api-key-file" not in plan_fleet(ask(), [0, 1], ports()).members[0].argv


def test_a_joined_fleet_administers_the_joined_router_and_has_no_clients_of_its_own():
    joined = ask(servers=1, advertise="10.0.0.2", join="http://10.0.0.1:8000")
    plan = plan_fleet(joined, [0, 1], ports())
    assert plan.admin_url == "http://10.0.0.1:8000" and plan.gate is None
    with pytest.raises(FleetPlanError, match="--client-key-file and --join"):
        plan_fleet(FleetRequest(**{**joined.__dict__, "client_key_file": Path("/k")}),
                   [0, 1], ports())  # fmt: skip
