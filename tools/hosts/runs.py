"""Names per run, the run's state file, and leftovers of runs that died.

Every namespace of a run is named ``vu-<tag>-<role>`` (``<tag>`` is the
creating process's pid, or a name given to the CLI; ``<role>`` is ``sw`` or
``h<i>``). Before the first namespace is made, the run writes a state file,
``/run/vllm-uma-hosts/vu-<tag>-.json``, naming its owner (pid and that
process's start time, so a reused pid is not taken for the owner) or saying
the run is *kept* (made by ``python -m tools.hosts up``, removed by ``down``).

A leftover is a ``vu-`` namespace whose run has no state file, or whose owner
is gone and which is not kept. Removing a namespace removes its veth ends and
its bridge; the other end of each veth goes with it.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from tools.hosts.ipcmd import HostsError, namespaces, pids_in, run

PREFIX = "vu-"
STATE_DIR = Path("/run/vllm-uma-hosts")
_TAG = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")


def run_prefix(tag: str) -> str:
    if not _TAG.match(tag):
        raise HostsError(
            f"name={tag!r} is invalid: use 1-16 lowercase letters, digits or '_', "
            "starting with a letter or digit (it becomes part of namespace names)."
        )
    return f"{PREFIX}{tag}-"


def prefix_of(netns: str) -> str | None:
    """``vu-123-h1`` -> ``vu-123-``; None for a namespace that is not ours."""
    if not netns.startswith(PREFIX) or "-" not in netns[len(PREFIX) :]:
        return None
    return netns.rsplit("-", 1)[0] + "-"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class RunState:
    prefix: str
    owner_pid: int
    owner_start: str | None
    kept: bool

    def path(self) -> Path:
        return STATE_DIR / f"{self.prefix}.json"

    def owner_alive(self) -> bool:
        return self.owner_start is not None and _start_time(self.owner_pid) == self.owner_start

    @staticmethod
    def mine(prefix: str, kept: bool) -> RunState:
        return RunState(prefix, os.getpid(), _start_time(os.getpid()), kept)

    def write(self) -> None:
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        self.path().write_text(json.dumps(self.__dict__))

    @staticmethod
    def read(prefix: str) -> RunState | None:
        try:
            return RunState(**json.loads((STATE_DIR / f"{prefix}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None


def free_tag(base: str) -> str:
    """``base``, or ``base_2``, ``base_3``...: the first whose run is not here
    (two networks in one process each get their own names)."""
    taken = {prefix_of(ns) for ns in namespaces()}
    if STATE_DIR.is_dir():
        taken |= {path.name[: -len(".json")] for path in STATE_DIR.glob(f"{PREFIX}*.json")}
    n = 1
    while run_prefix(tag := base if n == 1 else f"{base}_{n}") in taken:
        n += 1
    return tag


def namespaces_of(prefix: str) -> list[str]:
    return [ns for ns in namespaces() if prefix_of(ns) == prefix]


def remove_run(prefix: str) -> list[str]:
    """Remove every namespace of a run, what runs in them, and its state file.

    The processes are the run's own (started in its namespaces); they are
    ended so the namespace is really gone, not just unnamed.
    """
    removed = []
    # Hosts first, the switch last: its veth ends go as each host goes.
    for netns in sorted(namespaces_of(prefix), key=lambda n: n.endswith("-sw")):
        for pid in pids_in(netns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        run("ip", "netns", "del", netns, check=False)
        removed.append(netns)
    (STATE_DIR / f"{prefix}.json").unlink(missing_ok=True)
    return removed


def leftover_runs(include_kept: bool = False) -> list[str]:
    """The prefixes of runs whose namespaces are still here and whose owner is gone."""
    prefixes = sorted({p for p in map(prefix_of, namespaces()) if p})
    left = []
    for prefix in prefixes:
        state = RunState.read(prefix)
        if state is None or (not state.kept and not state.owner_alive()):
            left.append(prefix)
        elif state.kept and include_kept:
            left.append(prefix)
    return left


def cleanup_leftovers(include_kept: bool = False) -> dict[str, list[str]]:
    """Remove every leftover run; returns what was removed, by run."""
    removed = {prefix: remove_run(prefix) for prefix in leftover_runs(include_kept)}
    # State files whose namespaces are all gone already.
    for path in STATE_DIR.glob(f"{PREFIX}*.json") if STATE_DIR.is_dir() else []:
        state = RunState.read(path.name[: -len(".json")])
        if state is None or not namespaces_of(state.prefix):
            if state is None or state.kept or not state.owner_alive():
                path.unlink(missing_ok=True)
    return removed
