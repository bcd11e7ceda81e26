"""``vllm-uma fleet``: parse, plan, run (the supervisor's own process).

    vllm-uma fleet [MODEL] [--servers N] [--host H] [--port P]
        [--policy kv_aware] [--kv-store DIR|none] [--log-dir DIR] [serve flags]

The serve flags are checked once here with vLLM's own parser (as
``vllm-uma serve`` does), so that a typo fails before N servers start.
Exit statuses as `vllm-uma serve`: 2 for the command line, 1 for a failure
while running, 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
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
    parser.add_argument("--host", default="127.0.0.1", help="router address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="router port (default 8000)")
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
    parser.add_argument("--log-dir", type=Path, default=None, help="server and router logs")
    return parser


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
    from vllm_uma.fleet.plan import FleetPlanError, FleetRequest, plan_fleet
    from vllm_uma.fleet.supervisor import Fleet, FleetError
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
    try:
        events_dir = private_dir()  # the servers' KV event sockets: this user's only
    except PreflightError as exc:
        return _fail(str(exc), 2)
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
    )
    try:
        plan = plan_fleet(ask, sorted(os.sched_getaffinity(0)), free_port)
    except FleetPlanError as exc:
        return _fail(str(exc), 2)
    log_dir = fleet_args.log_dir or Path(tempfile.mkdtemp(prefix="vllm-uma-fleet-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(plan, [str(Path(sys.executable).parent / "vllm-uma")], log_dir)
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


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return status
