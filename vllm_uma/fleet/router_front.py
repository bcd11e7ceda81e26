"""A fleet's own router: the gate clients reach, vllm-router behind it on loopback.

Run by the supervisor (supervisor.py), in this order:
- the gate (gate.py) is bound before any server starts: a busy ``--port``
  fails in a second, not after the servers' minute; until the router
  answers, the gate answers 502;
- vllm-router starts once the servers answer, under the lifeline shim
  (vllm-router cannot watch its parent), through its launcher reading the
  fleet's API key from its file (router_main.py), and is ready when its
  ``/health`` answers on its loopback port;
- stop: the gate first (no new requests), then the router's session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from vllm_uma.fleet.api_key import ApiKeyError, ApiKeys, read_key_file
from vllm_uma.fleet.gate import Gate, GateError
from vllm_uma.fleet.plan import FleetPlan
from vllm_uma.lifeline import shim_command, supervised_env
from vllm_uma.log import get_logger

logger = get_logger(__name__)

ROUTER_READY_S = 120.0


class RouterFrontError(RuntimeError):
    """The gate or the router did not start; the message says why."""


def router_command(api_key_file: Path | None = None) -> list[str]:
    """vllm-router as installed beside this Python (a dependency); with
    ``api_key_file``, its launcher reading the fleet's key from that file
    (router_main.py), which then never appears on a command line."""
    exe = Path(sys.executable).parent / "vllm-router"
    if not exe.exists():
        raise RouterFrontError(
            f"vllm-router is not installed in this environment ({exe} is missing): "
            f"run `make install` (it installs vllm-router with vllm-uma)."
        )
    if api_key_file is None:
        return [str(exe)]
    return [sys.executable, "-m", "vllm_uma.fleet.router_main", str(api_key_file)]


class RouterFront:
    def __init__(self, plan: FleetPlan, keys: ApiKeys | None, log_dir: Path):
        self.plan = plan
        self._keys = keys
        self.log_path = log_dir / "router.log"
        self.gate: Gate | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None

    def open_gate(self) -> None:
        gate = self.plan.gate
        if gate is None:  # a plan whose router faces its clients itself
            return
        try:
            clients = None if gate.client_key_file is None else read_key_file(
                gate.client_key_file, "--client-key-file")  # fmt: skip
            self.gate = Gate(gate.host, gate.port, self.plan.admin_url, self._keys, clients)
        except (ApiKeyError, GateError) as exc:
            raise RouterFrontError(str(exc)) from None

    def start(self, servers: int, cancel: threading.Event) -> None:
        """The router, until its /health answers or ``cancel`` is set."""
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            shim_command([*router_command(self.plan.api_key_file), *self.plan.router_argv]),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **supervised_env()},
            start_new_session=True,
        )
        deadline = time.monotonic() + ROUTER_READY_S
        while time.monotonic() < deadline and not cancel.is_set():
            if self.proc.poll() is not None:
                raise RouterFrontError(
                    f"vllm-router exited with {self.proc.returncode} at start-up: "
                    f"{_tail(self.log_path)}"
                )
            try:
                if requests.get(f"{self.plan.admin_url}/health", timeout=2).ok:
                    self._say_where(servers)
                    return
            except requests.RequestException:
                pass
            cancel.wait(0.5)
        if not cancel.is_set():
            raise RouterFrontError(f"vllm-router did not answer /health in {ROUTER_READY_S:.0f} s")

    def _say_where(self, servers: int) -> None:
        logger.info(
            "fleet: %d servers behind vllm-router (%s) at %s (log %s; its metrics at "
            "http://127.0.0.1:%s/metrics)",
            servers, flag(self.plan, "--policy"), self.plan.router_url, self.log_path,
            flag(self.plan, "--prometheus-port"),
        )  # fmt: skip
        gate = self.plan.gate
        if gate is None:
            return
        clients = (
            f"a key of {gate.client_key_file}" if gate.client_key_file is not None
            else "any client that reaches it (no --client-key-file)"
        )  # fmt: skip
        admin = (
            f"the fleet's API key ({self.plan.api_key_file})" if self._keys is not None
            else "this process only"
        )  # fmt: skip
        logger.info(
            "fleet: the router serves /v1/*, /health and /metrics at %s to %s; adding or "
            "removing its workers takes %s.",
            gate.url, clients, admin,
        )  # fmt: skip

    def stop(self) -> None:
        """The gate, then the router; never raises, so the servers stop after it."""
        if self.gate is not None:
            self.gate.stop()
        if self.proc is not None:
            stop_router(self.proc)
        if self._log is not None:
            self._log.close()


def stop_router(router: subprocess.Popen) -> None:
    """SIGTERM to the router's session (its lifeline shim and vllm-router),
    SIGKILL 10 s later; never raises."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if router.poll() is not None:
            return
        try:
            os.killpg(router.pid, sig)
            router.wait(timeout=wait_s)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
    logger.error("fleet: vllm-router (pid %d) did not exit after SIGKILL.", router.pid)


def flag(plan: FleetPlan, name: str) -> str:
    argv = list(plan.router_argv)
    return argv[argv.index(name) + 1]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
