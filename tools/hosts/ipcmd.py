"""Running ``ip`` and ``tc``: one place that checks they are there, that we
are allowed to use them, and turns their failures into errors that say what
was run, what it said and what to do."""

from __future__ import annotations

import os
import shutil
import subprocess


class HostsError(RuntimeError):
    """A network of simulated hosts could not be made, changed or removed."""


def preflight() -> None:
    """Fail early, with the fix, where namespaces cannot be made at all."""
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            raise HostsError(
                f"`{tool}` is not on PATH: simulated hosts are made with it. "
                f"Install it (`apt-get install {package}`) and try again."
            )
    if os.geteuid() != 0:
        raise HostsError(
            f"simulated hosts need root (CAP_NET_ADMIN and CAP_SYS_ADMIN to make network "
            f"namespaces); this process runs as uid {os.geteuid()}. Run it with sudo, or as root."
        )


def run(*argv: str, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command; with ``check``, raise HostsError on failure."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise HostsError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {said}")
    return done


def namespaces() -> list[str]:
    """The names of every named network namespace on this machine."""
    out = run("ip", "netns", "list").stdout
    # Lines look like "vu-123-h1 (id: 4)" or just "vu-123-h1".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(netns: str) -> list[int]:
    """The processes running inside ``netns`` (``ip netns pids``)."""
    done = run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]
