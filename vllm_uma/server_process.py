"""A `vllm-uma serve` child process: start it, wait until it serves, ask it,
stop it with everything it started.

The runtime uses it where vllm-uma supervises servers of its own (the
prepare-model served check, models/served_check.py; the fleet,
fleet/supervisor.py); tests and tools use the same
class, so they drive servers exactly as users' commands do.

The server runs in its own session so that stopping it also stops vLLM's
engine-core and worker processes; its log goes to a file. What only tests
and tools read about a server (its model process, /metrics series, /proc
fields) is in tools/harness/server.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

READY_TIMEOUT_S = 300
# What a stop waits before SIGKILL: vllm-uma gives the engine 20 s to write
# pending KV blocks to the disk tier (kv_offload/config.py), plus a margin.
STOP_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(
        self,
        exe: str | list[str],
        args: list[str],
        log_path: Path,
        env: dict | None = None,
        port: int | None = None,
    ):
        """``exe``: the ``vllm-uma`` command, a path or an argv prefix
        (``[python, "-m", "vllm_uma.commands.main"]``); ``port``: a free one if None."""
        self.port = free_port() if port is None else port
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{self.port}"
        prefix = [exe] if isinstance(exe, str) else list(exe)
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            self.command(prefix, args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def command(self, prefix: list[str], args: list[str]) -> list[str]:
        """The argv started: ``prefix serve ARGS`` on this server's loopback
        port. A subclass that starts another server (a benchmark's stock
        vLLM) says so here and keeps the rest: readiness, requests, stop."""
        return [*prefix, "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()[-4000:]}")

    def post(self, path: str, payload: dict, timeout: float = 120) -> dict:
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
        disk tier after the API server has gone), then SIGKILL."""
        deadline = time.monotonic() + timeout
        if self.proc.poll() is None:
            # The API server alone: it stops its engine core itself. A second
            # SIGTERM reaching the engine core while it tears down kills it
            # mid-teardown (vLLM 0.32 restores SIG_DFL before its teardown),
            # before the disk tier has written its pending blocks.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # what did not stop in time
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self._log.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
