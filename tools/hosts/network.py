"""Network: a switch namespace with a bridge, N host namespaces each joined to
it by a veth, optional shaping of each link, cutting and restoring a link,
and running a command on a host. Use it as a context manager, or call
``up()`` and ``down()``; ``down()`` also runs when ``up()`` fails half-way.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tools.hosts import inside, shaping
from tools.hosts.ipcmd import HostsError, namespaces, preflight, run
from tools.hosts.runs import RunState, free_tag, remove_run, run_prefix
from tools.hosts.shaping import LinkShape

BRIDGE = "br0"
HOST_DEV = "eth0"
SUBNET_FIRST = "10.213"


@dataclass(frozen=True)
class Host:
    """One simulated host: its namespace, address, and its link's name on the switch."""

    index: int  # 1-based; the last byte of its address
    netns: str
    address: str  # 10.213.<net>.<index>, without the prefix length
    switch_port: str  # the veth end on the bridge, inside the switch namespace


class Network:
    """N hosts on one switch. Nothing is made before ``up()`` (or ``with``)."""

    def __init__(
        self,
        hosts: int,
        shape: LinkShape | None = None,
        net: int = 1,
        tag: str | None = None,
        kept: bool = False,
    ):
        """``hosts`` hosts at 10.213.``net``.1.., links shaped by ``shape``,
        namespaces ``vu-<tag>-*``; ``kept``: not a leftover when this process
        ends (the CLI's ``up``), removed by ``down`` or ``cleanup --all``."""
        if not 1 <= hosts <= 250:
            raise HostsError(f"hosts={hosts} is invalid: it must be 1-250 (one /24 each).")
        if not 0 <= net <= 255:
            raise HostsError(f"net={net} is invalid: it must be 0-255 (10.213.<net>.0/24).")
        # A name given is used as it is (and refused in up() if taken); the
        # default, this process's pid, moves aside for a run already there.
        self.prefix = run_prefix(tag or free_tag(str(os.getpid())))
        self.shape = shape or LinkShape()
        self.net = net
        self.kept = kept
        self.switch = f"{self.prefix}sw"
        self.hosts = [
            Host(i, f"{self.prefix}h{i}", f"{SUBNET_FIRST}.{net}.{i}", f"h{i}")
            for i in range(1, hosts + 1)
        ]
        self._children: list[subprocess.Popen] = []
        self._threads: dict[int, ThreadPoolExecutor] = {}

    # -- lifetime ---------------------------------------------------------

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> Network:
        preflight()
        taken = sorted(set(namespaces()) & {self.switch, *(h.netns for h in self.hosts)})
        if taken:
            raise HostsError(
                f"network namespaces {', '.join(taken)} exist already. Remove them with "
                f"`python -m tools.hosts down {self.prefix[3:-1]}` (or `cleanup` if their "
                "run died), or choose another name."
            )
        # The state file first: a run that dies from here on is found by cleanup.
        RunState.mine(self.prefix, self.kept).write()
        try:
            self._make()
        except BaseException:  # Ctrl-C included: leave nothing half-made
            self.down()
            raise
        return self

    def _make(self) -> None:
        run("ip", "netns", "add", self.switch)
        sw = ["ip", "-n", self.switch]
        run(*sw, "link", "add", BRIDGE, "type", "bridge")
        run(*sw, "link", "set", BRIDGE, "up")
        for host in self.hosts:
            run("ip", "netns", "add", host.netns)
            h = ["ip", "-n", host.netns]
            run(*h, "link", "set", "lo", "up")
            # Made inside the switch's namespace, its peer sent straight into
            # the host's: no link ever exists in the root namespace.
            run(*sw, "link", "add", host.switch_port, "type", "veth",
                "peer", "name", HOST_DEV, "netns", host.netns)  # fmt: skip
            run(*sw, "link", "set", host.switch_port, "master", BRIDGE)
            run(*sw, "link", "set", host.switch_port, "up")
            run(*h, "addr", "add", f"{host.address}/24", "dev", HOST_DEV)
            run(*h, "link", "set", HOST_DEV, "up")
            shaping.apply(host.netns, HOST_DEV, self.shape)
            shaping.apply(self.switch, host.switch_port, self.shape)

    def down(self) -> None:
        """End the commands started with ``run`` and remove every namespace."""
        for child in self._children:
            if child.poll() is None:
                child.kill()
        for child in self._children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._children.clear()
        # After the children: a thread's end kills what it started with
        # PR_SET_PDEATHSIG, and whoever started it there stops it first.
        for thread in self._threads.values():
            thread.shutdown(wait=True, cancel_futures=True)
        self._threads.clear()
        remove_run(self.prefix)

    # -- partitions -------------------------------------------------------

    def host(self, index: int) -> Host:
        return self.hosts[index - 1]

    def cut(self, index: int) -> None:
        """Cut a host's link at the switch: its packets, and others' to it, are
        dropped without a word, as when a cable or a switch port fails, so a
        peer's request times out rather than failing at once."""
        run("ip", "-n", self.switch, "link", "set", self.host(index).switch_port, "down")

    def restore(self, index: int) -> None:
        run("ip", "-n", self.switch, "link", "set", self.host(index).switch_port, "up")

    # -- commands on a host -----------------------------------------------

    def popen(self, index: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside host ``index``'s namespace; ended by ``down()``.

        The environment is this process's unless ``env=`` says otherwise;
        every other keyword is subprocess.Popen's.
        """
        child = subprocess.Popen(["ip", "netns", "exec", self.host(index).netns, *argv], **kwargs)
        self._children.append(child)
        return child

    def on(self, index: int) -> ThreadPoolExecutor:
        """Host ``index``'s thread in this process (tools/hosts/inside.py):
        ``net.on(2).submit(fn, ...).result()`` runs ``fn`` on host 2; what
        it starts runs there, and lives until ``down()`` at the latest."""
        if index not in self._threads:
            self._threads[index] = inside.executor(self.host(index).netns)
        return self._threads[index]

    def describe(self) -> list[str]:
        lines = [f"switch {self.switch} (bridge {BRIDGE}); links: {self.shape.describe()}"]
        lines += [f"host {h.index} {h.netns} {h.address}" for h in self.hosts]
        return lines
