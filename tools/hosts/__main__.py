"""python -m tools.hosts: make, list and remove simulated hosts from a shell.

    up --hosts 3 [--rate-mbit 1000] [--delay-ms 0.5] [--net 1] [--name NAME]
    down NAME            remove the network ``up`` made (NAME as ``up`` printed it)
    cleanup [--all]      remove leftovers of runs that died (--all: kept ones too)
    list                 every run's namespaces and whether it is kept, live or left over

A network made by ``up`` stays until ``down``: run commands on a host with
``ip netns exec <namespace> CMD``. Exit status: 0, 1 on an error (its line
says the fix), 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import os
import sys

from tools.hosts.ipcmd import HostsError, namespaces, preflight
from tools.hosts.network import Network
from tools.hosts.runs import (
    PREFIX,
    RunState,
    cleanup_leftovers,
    leftover_runs,
    namespaces_of,
    prefix_of,
    remove_run,
    run_prefix,
)
from tools.hosts.shaping import LinkShape


def _up(args) -> None:
    shape = LinkShape(rate_mbit=args.rate_mbit, delay_ms=args.delay_ms)
    network = Network(args.hosts, shape, net=args.net, tag=args.name or str(os.getpid()), kept=True)
    network.up()
    print("\n".join(network.describe()))
    name = network.prefix[len(PREFIX) : -1]
    print(f"run a command on a host: ip netns exec {network.host(1).netns} CMD")
    print(f"remove it: python -m tools.hosts down {name}")


def _down(args) -> None:
    prefix = run_prefix(args.name)
    if not namespaces_of(prefix):
        raise HostsError(
            f"no network named {args.name!r} (no namespace {prefix}*). "
            "`python -m tools.hosts list` shows the ones there are."
        )
    for netns in remove_run(prefix):
        print(f"removed {netns}")


def _cleanup(args) -> None:
    removed = cleanup_leftovers(include_kept=args.all)
    for prefix, names in removed.items():
        print(f"removed {prefix}*: {' '.join(names)}")
    if not removed:
        print("no leftovers")


def _list(args) -> None:
    left = set(leftover_runs())
    for prefix in sorted({p for p in map(prefix_of, namespaces()) if p}):
        state = RunState.read(prefix)
        status = "leftover" if prefix in left else "kept" if state.kept else "live"
        print(f"{prefix[len(PREFIX) : -1]}: {status}: {' '.join(namespaces_of(prefix))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.hosts", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make a network of hosts; it stays until `down`")
    up.add_argument("--hosts", type=int, required=True)
    up.add_argument("--rate-mbit", type=float, default=None, help="each direction; none: unshaped")
    up.add_argument("--delay-ms", type=float, default=0.0, help="one way; needs netem")
    up.add_argument("--net", type=int, default=1, help="addresses 10.213.NET.<i>/24")
    up.add_argument("--name", help="namespaces vu-NAME-*; default: this process's pid")
    down = sub.add_parser("down", help="remove a network `up` made")
    down.add_argument("name")
    clean = sub.add_parser("cleanup", help="remove leftovers of runs that died")
    clean.add_argument("--all", action="store_true", help="networks made by `up` too")
    sub.add_parser("list", help="the networks there are")
    args = parser.parse_args(argv)
    commands = {"up": _up, "down": _down, "cleanup": _cleanup, "list": _list}
    try:
        preflight()
        commands[args.command](args)
    except HostsError as e:
        print(f"hosts: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
