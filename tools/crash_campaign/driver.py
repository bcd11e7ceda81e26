"""The campaign's rounds: kill one server at a random moment, restart it,
freeze them all, check the store.

Runs in the campaign's own process. Servers are forked from it (worker.py)
after it has imported the disk tier, so a restart is a fork, not a Python
start-up. A round is either a kill under traffic (a random server, a random
time after its last start) or a kill during start-up (the server is killed,
restarted and killed again before it says ready: mid-scan, mid-reconcile or
mid-eviction to the cap). The victim is then restarted; once it is ready,
every live server is frozen with SIGSTOP, the store checked
(invariants.py), and the servers thawed. A server that died unbidden, or
said VIOLATION, or a start that does not finish, is a violation too.

With a ``filler`` (disk_full.py), a share of the rounds (``full_share``)
run on a full disk: the file system under the store is filled before the
kill, and stays full until a round draws otherwise, start-ups included. A
start on a full disk cannot reconcile the ledger (it is put off), so that
round's check spares dead servers' unfinished rows; the clean stop first
gives the space back and starts one more server, whose start-up settles
them, so the strict check spares nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.crash_campaign import invariants, worker
from tools.crash_campaign.disk_full import DiskFiller
from vllm_uma.kv_offload.disk.block_file import file_bytes

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# The share of rounds that kill a server during its start-up.
STARTUP_SHARE = 0.3


@dataclass
class Tally:
    kills: int = 0
    startup_kills: int = 0
    rounds: int = 0
    full_rounds: int = 0  # rounds run on a full disk
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        full = f", on a full disk: {self.full_rounds} rounds" if self.full_rounds else ""
        return (
            f"kills={self.kills} rounds={self.rounds} violations={len(self.violations)} "
            f"(start-up kills={self.startup_kills}, under traffic="
            f"{self.kills - self.startup_kills}{full})"
        )


class _Server:
    """One forked worker and its ready pipe."""

    def __init__(self, plan: worker.WorkerPlan, cap_bytes: int):
        read_fd, write_fd = os.pipe()
        context = multiprocessing.get_context("fork")
        self.process = context.Process(
            target=worker.run, args=(plan, write_fd, cap_bytes), daemon=True
        )
        self.started = time.monotonic()
        self.process.start()
        os.close(write_fd)
        self._ready_fd: int | None = read_fd
        self.ready = False

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the tier's start-up is done; False if it died or hung."""
        if self.ready:
            return True
        assert self._ready_fd is not None
        readable, _, _ = select.select([self._ready_fd], [], [], timeout_s)
        self.ready = bool(readable) and os.read(self._ready_fd, 1) == b"r"
        return self.ready

    def kill(self) -> None:
        # exitcode is None while the pid is still ours (alive, or a zombie
        # not reaped yet): a reaped pid may be another process's by now.
        if self.process.exitcode is None:
            os.kill(self.pid, signal.SIGKILL)
        self.process.join()
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None


def _wait_stopped(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Until every thread of ``pid`` is stopped (or gone): a SIGSTOP is
    delivered asynchronously, and a thread still running could change the
    store while it is checked."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return  # gone: nothing of it runs
        states = []
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    states.append(stat.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass  # that thread ended
        if all(state in "tTZX" for state in states):
            return
        time.sleep(0.001)


class Campaign:
    def __init__(
        self,
        root: Path,
        logs: Path,
        *,
        servers: int,
        cap_blocks: int,
        seed: int,
        traffic_s: float,
        progress: Callable[[Tally], None] | None = None,
        filler: Path | None = None,
        full_share: float = 0.0,
    ):
        self.root, self.logs = root, logs
        self._disk = None if filler is None else DiskFiller(filler)
        self.full_share = full_share
        self._progress = progress
        self.cap_blocks, self.traffic_s = cap_blocks, traffic_s
        self.cap_bytes = cap_blocks * file_bytes(worker.ROW_BYTES)
        self.rng = random.Random(seed)
        self.tally = Tally()
        self._starts = 0
        self._servers = [self._start() for _ in range(servers)]
        self.startup_s = 0.05  # learnt from each start that finishes
        for server in self._servers:
            self._ready(server)

    def run(self, kills: int) -> Tally:
        try:
            while self.tally.kills < kills:
                before = self.tally.kills
                self._round()
                if self._progress and self.tally.kills // 50 > before // 50:
                    self._progress(self.tally)
        finally:
            self._stop_all()
        return self.tally

    def _start(self) -> _Server:
        self._starts += 1
        plan = worker.WorkerPlan(
            self.root,
            self.cap_blocks,
            self.rng.randrange(2**32),
            self.logs / "servers.log",
            os.getpid(),
        )
        return _Server(plan, self.cap_bytes)

    def _ready(self, server: _Server) -> None:
        if server.wait_ready(READY_TIMEOUT_S):
            # The latest start's length: the store grows, and so do starts.
            self.startup_s = time.monotonic() - server.started
            return
        server.kill()
        self._violation(f"a server's start did not finish in {READY_TIMEOUT_S:.0f} s")

    def _round(self) -> None:
        if self._disk is not None:
            self._disk.set_full(self.rng.random() < self.full_share)
            self.tally.full_rounds += self._disk.full
        slot = self.rng.randrange(len(self._servers))
        victim = self._servers[slot]
        if self.rng.random() < STARTUP_SHARE:
            self._kill(victim)
            victim = self._start()
            # Before it says ready, up to a little past the latest start.
            time.sleep(self.rng.uniform(0, 1.2 * self.startup_s))
            self.tally.startup_kills += not victim.wait_ready(0)
        else:
            time.sleep(self.rng.uniform(0, self.traffic_s))
        self._kill(victim)
        self._servers[slot] = restarted = self._start()
        self._ready(restarted)
        self._check()
        self.tally.rounds += 1

    def _kill(self, server: _Server) -> None:
        if not server.process.is_alive():
            self._died_unbidden(server)
        server.kill()
        self.tally.kills += 1

    def _check(self) -> None:
        live = [s for s in self._servers if s.process.is_alive()]
        for server in self._servers:
            if server not in live:
                self._died_unbidden(server)
        for server in live:
            os.kill(server.pid, signal.SIGSTOP)
        for server in live:  # a stop lands asynchronously: wait for every thread's
            _wait_stopped(server.pid)
        try:
            settled = self._disk is None or not self._disk.full
            self._check_store(f"after kill {self.tally.kills}", {s.pid for s in live}, settled)
        finally:
            for server in live:
                os.kill(server.pid, signal.SIGCONT)

    def _stop_all(self) -> None:
        """SIGTERM every server (each drains its tier), then the strict check."""
        if self._disk is not None and self._disk.full:
            self._disk.set_full(False)
            self._servers.append(extra := self._start())  # it settles what the full disk left
            self._ready(extra)
        for server in self._servers:
            if server.process.exitcode is None:
                os.kill(server.pid, signal.SIGTERM)
        for server in self._servers:
            server.process.join(STOP_TIMEOUT_S)
            if server.process.is_alive():
                self._violation(f"server pid {server.pid} did not stop in {STOP_TIMEOUT_S} s")
            elif server.process.exitcode != 0:
                self._violation(f"server pid {server.pid} stopped with {self._exit_of(server)}")
            server.kill()  # what did not stop; reaps, and closes its pipe
        self._check_store("after the clean stop", set(), strict=True)

    def _check_store(
        self, when: str, live_pids: set[int], settled: bool = True, strict: bool = False
    ) -> None:
        found = invariants.check_store(
            self.root,
            cap_bytes=self.cap_bytes,
            file_bytes=file_bytes(worker.ROW_BYTES),
            live_pids=live_pids,
            io_threads=worker.IO_THREADS,
            strict=strict,
            settled=settled,
        )
        for line in found:
            self._violation(f"{when}: {line}")

    def _died_unbidden(self, server: _Server) -> None:
        self._violation(f"server pid {server.pid} died unbidden: {self._exit_of(server)}")

    def _exit_of(self, server: _Server) -> str:
        code = server.process.exitcode
        if code == worker.VIOLATION_EXIT:
            return f"a violation it found (see {self.logs / 'servers.log'})"
        return f"exit code {code} (see {self.logs / 'servers.log'})"

    def _violation(self, line: str) -> None:
        self.tally.violations.append(line)
