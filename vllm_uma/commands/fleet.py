"""``vllm-uma fleet``: parse, plan, run (the supervisor's own process).

    vllm-uma fleet [MODEL] [--servers N] [--host H] [--port P]
        [--policy kv_aware] [--kv-store DIR|none] [--kv-network URL [--kv-secret-file PATH]]
        [--advertise ADDR] [--join ROUTER_URL | --peer URL[=EVENTS] ...]
        [--api-key-file PATH] [--client-key-file PATH] [--log-dir DIR] [serve flags]

One host of several: ``--advertise`` is this host's address on the network
the hosts share (its servers and their KV event relays listen there);
``--join`` adds the servers to another host's router instead of starting
one; ``--peer`` gives this fleet's router the servers of other hosts;
``--kv-network`` is the network tier every host reads (docs/fleet.md,
"Several hosts"); its values are signed with the key in ``--kv-secret-file``
(created with a new key if missing), which every host must hold.

One API key per fleet, in ``--api-key-file`` (created if missing, the same
file on every host): every server requires it, the router sends it, and
only a holder may add or remove the router's workers; ``--client-key-file``
makes the router's clients need a key too (docs/fleet.md, "Who can steer a
fleet").

The serve flags are checked once here with vLLM's own parser (as
``vllm-uma serve`` does), so that a typo fails before N servers start.
Exit statuses as `vllm-uma serve`: 2 for the command line, 1 for a failure
while running, 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

from vllm_uma import lifeline

PROG = "vllm-uma fleet"
POLICIES = ("cache_aware", "kv_aware", "round_robin", "power_of_two", "consistent_hash")
# kv_aware routes by the blocks each server reports holding (L1, pool,
# disk), not by what the router once sent where (cache_aware); measured in
# docs/fleet.md.
DEFAULT_POLICY = "kv_aware"
# The network tier's secret, in the cache directory, when --kv-secret-file is not given.
SECRET_NAME = "kv-network.secret"
# The fleet's API key, in the cache directory, when --api-key-file is not given.
API_KEY_NAME = "fleet-api.key"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [MODEL] [--servers N] [fleet flags] [any `vllm serve` flag]",
        description=(
            "Several vllm-uma servers on this host behind vLLM's router (vllm-router), "
            "one URL for clients. Cores and --gpu-memory-utilization are divided "
            "between the servers; each has a host pool, all share one disk store, "
            "and the router sends each request to the server that served its "
            "prefix. Other flags go to every server. Ctrl-C stops everything "
            "(disk tiers drain)."
        ),
    )
    parser.add_argument("--servers", type=int, default=2, help="servers (default 2)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="where clients reach the router (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="the router's port for clients (default 8000)"
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default=DEFAULT_POLICY,
        help=f"router policy (default {DEFAULT_POLICY}; docs/fleet.md compares them)",
    )
    parser.add_argument(
        "--kv-store",
        default=None,
        help="the servers' shared disk store (default: <cache dir>/kv-store); 'none': no disk tier",
    )
    parser.add_argument(
        "--kv-network",
        default=None,
        metavar="URL",
        help="the network KV tier every host reads: valkey://HOST:PORT/DB (or redis://); "
        "after the disk store, or alone with --kv-store none",
    )
    parser.add_argument(
        "--kv-secret-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="with --kv-network: the file of the key that signs the network tier's values, "
        "the same on every host (default: <cache dir>/kv-network.secret, created with a new "
        "key, mode 0600, if missing: copy it to the other hosts)",
    )
    parser.add_argument(
        "--advertise",
        default="127.0.0.1",
        metavar="ADDR",
        help="this host's address, where its servers and KV event relays listen for a "
        "router on another host (default 127.0.0.1: this host only)",
    )
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument(
        "--join",
        default=None,
        metavar="ROUTER_URL",
        help="add the servers to the vllm-router at http://HOST:PORT on another host "
        "instead of starting a router here",
    )
    hosts.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="URL[=EVENTS]",
        help="a server of another host for this fleet's router, with its KV events "
        "(http://HOST:PORT=tcp://HOST:PORT, as `--join` prints); repeat per server",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="the fleet's API key, the same file on every host: every server requires it, "
        "the router sends it, and only its holders may add or remove the router's workers "
        f"(default: <cache dir>/{API_KEY_NAME}, created with a new key, mode 0600, if "
        "missing: copy it to the other hosts)",
    )
    parser.add_argument(
        "--client-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="clients of the router must send one of this file's keys (one a line, mode "
        "0600) as Authorization: Bearer KEY for /v1/* and /metrics (default: any client "
        "that reaches --host)",
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="server and router logs")
    return parser


def check_hosts_flags(fleet_args) -> str | None:
    """What is wrong with the flags of one host of several, or None."""
    import ipaddress
    import socket

    try:
        address = ipaddress.ip_address(fleet_args.advertise)
    except ValueError:
        return (
            f"--advertise {fleet_args.advertise!r} is not an IP address: give this host's "
            f"address on the network the hosts share (ip -brief addr shows them)."
        )
    if address.version != 4 or address.is_unspecified:
        return (
            f"--advertise {fleet_args.advertise}: give one IPv4 address of this host, the "
            f"one other hosts reach it at (an IPv6 or an unspecified address cannot be "
            f"advertised to them yet)."
        )
    with socket.socket(socket.AF_INET) as s:
        try:
            s.bind((fleet_args.advertise, 0))
        except OSError as exc:
            return (
                f"--advertise {fleet_args.advertise}: this host cannot listen there "
                f"({exc.strerror}): give an address of one of its interfaces "
                f"(ip -brief addr shows them)."
            )
    join = fleet_args.join
    if join is not None and not re.fullmatch(r"http://[^/\s:]+:\d+/?", join):
        return f"--join {join!r} is invalid: it must be the router's http://HOST:PORT."
    if join is not None and address.is_loopback:
        return (
            "--join adds this host's servers to a router on another host, which cannot "
            "reach them on loopback: add --advertise with this host's address on the "
            "network the hosts share."
        )
    if fleet_args.kv_network is not None:
        from vllm_uma.kv_offload.network.settings import parse_network_tier

        try:
            # The URL alone: the fleet names the secret itself (fleet/plan.py).
            parse_network_tier({"type": "valkey", "url": fleet_args.kv_network}, reads_values=False)
        except ValueError as exc:
            return f"--kv-network: {exc}"
    return None


def check_weight_updates(kv_store, kv_network, weight_transfer: bool, environ) -> str | None:
    """What is wrong with the fleet's shared tiers when its servers' weights
    could change at run time (kv_offload/weight_updates.py), or None: said
    once here rather than by every server's preflight."""
    from vllm_uma.kv_offload.refusals import OffloadingConfigError
    from vllm_uma.kv_offload.weight_updates import refuse_weight_updates, tiers_named

    tiers = tiers_named(kv_store is not None, kv_network is not None)
    turn_off = "start the fleet with --kv-store none and without --kv-network"
    try:
        refuse_weight_updates(tiers, environ, weight_transfer, turn_off)
    except OffloadingConfigError as exc:
        return str(exc)
    return None


def main(argv: list[str]) -> int:
    # A fleet started by a supervisor (a test, a tool) stops with it; its own
    # servers and router follow the fleet (vllm_uma/lifeline.py).
    lifeline.stop_with_supervisor()
    parser = build_parser()
    fleet_args, serve_flags = parser.parse_known_args(argv)
    from vllm_uma import models
    from vllm_uma.commands.kv_events_endpoint import private_dir
    from vllm_uma.commands.preflight import PreflightError
    from vllm_uma.commands.serve import parse_serve_args
    from vllm_uma.fleet.plan import FleetPlanError, FleetRequest, Peer, plan_fleet
    from vllm_uma.fleet.supervisor import Fleet, FleetError
    from vllm_uma.fleet.worker_record import record_dir
    from vllm_uma.server_process import free_port

    try:
        serve_args = parse_serve_args(list(serve_flags))  # vLLM's own checks
    except models.PrepareError as exc:
        return _fail(str(exc), 1)
    except SystemExit as exc:  # argparse already printed why
        return int(exc.code or 2)
    from vllm.logger import configure_logging_from_args

    configure_logging_from_args(serve_args)  # our log lines in vLLM's format
    model = serve_args.model
    if fleet_args.kv_store is None:
        kv_store = models.default_cache_root() / "kv-store"
    else:
        kv_store = None if fleet_args.kv_store == "none" else Path(fleet_args.kv_store)
    if problem := check_hosts_flags(fleet_args):
        return _fail(problem, 2)
    transfer = getattr(serve_args, "weight_transfer_config", None) is not None
    if problem := check_weight_updates(kv_store, fleet_args.kv_network, transfer, os.environ):
        return _fail(problem, 2)
    try:
        peers = tuple(Peer.parse(p) for p in fleet_args.peer)
    except FleetPlanError as exc:
        return _fail(str(exc), 2)
    try:
        events_dir = private_dir()  # the servers' KV event sockets: this user's only
    except PreflightError as exc:
        return _fail(str(exc), 2)
    secret_file = None
    if fleet_args.kv_network is not None:
        given = fleet_args.kv_secret_file or models.default_cache_root() / SECRET_NAME
        secret_file = given.expanduser().resolve()
        if problem := fleet_secret(secret_file):
            return _fail(problem, 2)
    elif fleet_args.kv_secret_file is not None:
        return _fail(
            "--kv-secret-file signs the network tier's values: add --kv-network URL, or "
            "remove --kv-secret-file.",
            2,
        )
    given_key = fleet_args.api_key_file or models.default_cache_root() / API_KEY_NAME
    api_key_file = given_key.expanduser().resolve()
    if problem := fleet_api_key(api_key_file):
        return _fail(problem, 2)
    client_key_file = None
    if fleet_args.client_key_file is not None:
        client_key_file = fleet_args.client_key_file.expanduser().resolve()
        if problem := checked_key_file(client_key_file, "--client-key-file"):
            return _fail(problem, 2)
    ask = FleetRequest(
        metrics_port=free_port(),
        events_dir=events_dir,
        servers=fleet_args.servers,
        model=str(model),
        serve_flags=tuple(serve_flags),
        host=fleet_args.host,
        port=fleet_args.port,
        policy=fleet_args.policy,
        kv_store=None if kv_store is None else kv_store.expanduser().resolve(),
        advertise=fleet_args.advertise,
        join=fleet_args.join,
        peers=peers,
        network_url=fleet_args.kv_network,
        network_secret_file=secret_file,
        api_key_file=api_key_file,
        client_key_file=client_key_file,
    )
    try:
        plan = plan_fleet(ask, sorted(os.sched_getaffinity(0)), free_port)
    except FleetPlanError as exc:
        return _fail(str(exc), 2)
    log_dir = fleet_args.log_dir or Path(tempfile.mkdtemp(prefix="vllm-uma-fleet-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    records = None
    if plan.join:  # that router outlives this fleet: what we add there is recorded
        try:
            records = record_dir(models.default_cache_root())
        except PreflightError as exc:
            return _fail(str(exc), 2)
    fleet = Fleet(plan, [str(Path(sys.executable).parent / "vllm-uma")], log_dir, records)
    signal.signal(signal.SIGTERM, fleet.request_stop)
    signal.signal(signal.SIGINT, fleet.request_stop)
    try:
        fleet.start()
        status = fleet.watch()
    except FleetError as exc:
        status = _fail(str(exc), 1)
    finally:  # whatever happened, nothing this fleet started keeps running
        fleet.stop()
    return status


def fleet_secret(path: Path) -> str | None:
    """Create the network tier's secret at ``path`` unless it is there,
    and check it; what is wrong with it, or None. Every server of the fleet
    names the file (fleet/plan.py): the key never reaches a command line."""
    from vllm_uma.kv_offload import mac_keys

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = mac_keys.generate_file(str(path))
        keys = mac_keys.read_file(str(path))
    except (OSError, mac_keys.SecretError) as exc:
        return f"--kv-secret-file: {exc}"
    if created:
        print(
            f"{PROG}: created {path} with a new key (id {keys.signing.id.hex()}) to sign the "
            f"network tier's values: copy it (mode 0600) to every other host of the fleet "
            f"and pass it there as --kv-secret-file.",
            file=sys.stderr,
            flush=True,
        )
    return None


def fleet_api_key(path: Path) -> str | None:
    """Create the fleet's API key at ``path`` unless it is there, and check
    it; what is wrong with it, or None. Every server, the router and the
    gate read the file (fleet/api_key.py): the key never reaches a command line."""
    from vllm_uma.fleet.api_key import generate_key_file

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = generate_key_file(path)
    except OSError as exc:
        return (
            f"--api-key-file {path}: cannot be created ({exc.strerror}): name a file in a "
            f"directory this user may write, or create it with one key, mode 0600."
        )
    if problem := checked_key_file(path, "--api-key-file"):
        return problem
    if created:
        print(
            f"{PROG}: created {path} with a new API key for the fleet's servers and router: "
            f"copy it (mode 0600) to every other host of the fleet and pass it there as "
            f"--api-key-file.",
            file=sys.stderr,
            flush=True,
        )
    return None


def checked_key_file(path: Path, flag: str) -> str | None:
    from vllm_uma.fleet.api_key import ApiKeyError, read_key_file

    try:
        read_key_file(path, flag)
    except ApiKeyError as exc:
        return str(exc)
    return None


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return status
