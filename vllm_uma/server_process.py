"""A `vllm-uma serve` child process: start it, wait until it serves, ask it,
stop it with everything it started.

The runtime uses it where vllm-uma supervises servers of its own (the
prepare-model served check, models/served_check.py; the fleet,
fleet/supervisor.py); tests and tools use the same
class, so they drive servers exactly as users' commands do.

The server runs in its own session so that stopping it also stops vLLM's
engine-core and worker processes, and is tied to the process that made the
Server (lifeline.py): it stops when that process exits, SIGKILL included.
Its log goes to a file. What only tests
and tools read about a server (its model process, /metrics series, /proc
fields) is in tools/harness/server.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from vllm_uma.lifeline import supervised_env

READY_TIMEOUT_S = 300
# What a stop waits before SIGKILL: vllm-uma gives the engine 20 s to write
# pending KV blocks to the disk tier (kv_offload/config.py), plus a margin.
STOP_TIMEOUT_S = 30
# What one request may take before the caller gives up: a hang detector, not
# a speed check. On a CPU without AVX-512 (bf16 through torch's fallback
# linear, about 40 tokens/s on one core) four 1,200-token prompts at once
# took longer than the 120 s this used to be, and the offloading tests failed.
REQUEST_TIMEOUT_S = 600
# A server whose port was taken between free_port() and its own bind starts
# again on another port, this many times at most (see Server.wait_ready).
PORT_TAKEN_RETRIES = 3
PORT_TAKEN = "is already in use"  # commands/preflight.py's refusal
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
_handed_out: set[int] = set()


class StartCancelled(RuntimeError):
    """A stop was asked for while the server was starting."""


def free_port() -> int:
    """A loopback port no one listens on, never the same twice in a process.

    Drawn outside the kernel's ephemeral range: a bind to port 0 anywhere
    on the machine (vLLM's get_open_port for torch.distributed, every
    outgoing connection) takes ports from that range, so a port drawn from
    it can be taken in the seconds before the server binds it. That is how
    a second server once found its port held by another server's engine
    core.
    """
    low, high = _ephemeral_range()
    outside = [*range(LOWEST_PORT, low), *range(high + 1, 65_536)]
    for port in random.sample(outside, min(200, len(outside))):
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # no room outside the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Server:
    def __init__(
        self,
        exe: str | list[str],
        args: list[str],
        log_path: Path,
        env: dict | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
    ):
        """``exe``: the ``vllm-uma`` command, a path or an argv prefix
        (``[python, "-m", "vllm_uma.commands.main"]``); ``port``: a free one if None;
        ``host``: the address it listens on and is reached at (a fleet's
        server on one host of several listens on that host's address)."""
        self.host = host
        self._chose_port = port is None
        self.log_path = log_path
        self._prefix = [exe] if isinstance(exe, str) else list(exe)
        self._args = args
        # Tied to this process: it stops when we exit, however we exit.
        self._env = {**os.environ, **(env or {}), **supervised_env()}
        self._port_retries = PORT_TAKEN_RETRIES
        self._stopped = False
        self._start(free_port() if port is None else port)

    def _start(self, port: int) -> None:
        self.port = port
        self.url = f"http://{self.host}:{port}"
        # Appended to: a server started again (a fleet's restart, a new port)
        # keeps the lines of the run that failed, which say why.
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            self.command(self._prefix, self._args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env,
            start_new_session=True,
        )

    def command(self, prefix: list[str], args: list[str]) -> list[str]:
        """The argv started: ``prefix serve ARGS`` on this server's address
        and port. A subclass that starts another server (a benchmark's stock
        vLLM) says so here and keeps the rest: readiness, requests, stop."""
        return [*prefix, "serve", *args, "--host", self.host, "--port", str(self.port)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(
        self, timeout: float = READY_TIMEOUT_S, cancel: threading.Event | None = None
    ) -> "Server":
        """Until /health answers. ``cancel``: a stop request of the caller's,
        honoured within a second (the server is left to the caller's stop)."""
        cancel = cancel or threading.Event()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cancel.is_set():
                raise StartCancelled(f"a stop was asked for while {self.url} was starting")
            if self.proc.poll() is not None:
                if self._port_was_taken():
                    self._log.close()
                    self._port_retries -= 1
                    self._start(free_port())
                    continue
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            cancel.wait(1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()[-4000:]}")

    def _port_was_taken(self) -> bool:
        """The server refused a port it was given by free_port() because
        another process bound it meanwhile: worth one more start, on a new
        port. A port the caller chose is the caller's to fix."""
        return (
            self._chose_port
            and self._port_retries > 0
            and self.proc.returncode == 2
            and PORT_TAKEN in self.log()
        )

    def post(self, path: str, payload: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        response = requests.post(f"{self.url}{path}", json=payload, timeout=timeout)
        response.raise_for_status()
        return response.json()

    def chat(self, model: str, question: str, max_tokens: int, **fields) -> dict:
        """A greedy chat completion of one user message; ``max_tokens`` is
        required so that no caller waits on a runaway generation."""
        message = {"role": "user", "content": question}
        payload = {"model": model, "messages": [message], "temperature": 0}
        return self.post("/v1/chat/completions", {**payload, "max_tokens": max_tokens, **fields})

    def complete(self, model: str, prompt: str, max_tokens: int, **fields) -> dict:
        """A greedy completion of ``prompt`` (base models have no chat
        template); ``max_tokens`` is required, as for :meth:`chat`."""
        payload = {"model": model, "prompt": prompt, "temperature": 0}
        return self.post("/v1/completions", {**payload, "max_tokens": max_tokens, **fields})

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to the server, then up to ``timeout`` seconds for every
        process of its session to exit by itself (the engine core drains its
        disk tier after the API server has gone), then SIGKILL. A second
        call does nothing: the session's id may belong to others by then."""
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + timeout
        if self.proc.poll() is None:
            # The API server alone: it stops its engine core itself. A second
            # SIGTERM reaching the engine core while it tears down kills it
            # mid-teardown (vLLM 0.32 restores SIG_DFL before its teardown),
            # before the disk tier has written its pending blocks.
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what did not stop in time
        # Still there: stuck in the kernel; SIGKILLed, the kernel ends it when it can.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie whose threads
    are all gone does not count: it holds no memory, port or file any more,
    and the orphans of the session (multiprocessing's resource tracker) are
    reaped by whoever adopted them, which on some machines' init takes a
    second or more. (A group leader shows Z as soon as its own thread ends,
    while its other threads may still be freeing the address space.)"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(pgrp == pgid and not gone for pgrp, gone in _process_groups())


def _process_groups() -> Iterator[tuple[int, bool]]:
    """(process group, finished) of every process /proc lists now:
    finished is a zombie with no thread left but itself."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parens.
            fields = stat[stat.rindex(b")") + 2 :].split()
            gone = fields[0] == b"Z" and len(os.listdir(f"/proc/{entry.name}/task")) <= 1
        except OSError:  # exited meanwhile
            continue
        yield int(fields[2]), gone
