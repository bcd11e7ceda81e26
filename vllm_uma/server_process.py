"""A `vllm-uma serve` child process: start it, wait until it serves, ask it,
read its /metrics and its model process, stop it with everything it started.

The runtime uses it where vllm-uma supervises servers of its own (the
prepare-model served check, served_check.py); tests and tools use the same
class, so they drive servers exactly as users' commands do.

The server runs in its own session so that stopping it also stops vLLM's
engine-core and worker processes; its log goes to a file. The process that
holds the model and the KV cache is the worker ("VLLM::Worker") with vLLM's
'mp' executor, or the engine-core process ("VLLM::EngineCore") with 'uni',
vllm-uma's default for one worker. Tests and benchmarks read its RSS and
VmLck.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import requests


def model_process(server_pid: int) -> psutil.Process:
    """The descendant of ``server_pid`` that runs the model."""
    by_title: dict[str, psutil.Process] = {}
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            by_title.setdefault(child.name(), child)
        except psutil.Error:
            continue
    for prefix in ("VLLM::Worker", "VLLM::EngineCore"):
        for title, proc in by_title.items():
            if title.startswith(prefix):
                return proc
    raise LookupError(f"no VLLM::Worker or VLLM::EngineCore process under pid {server_pid}")


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
        (``[python, "-m", "vllm_uma.cli"]``); ``port``: a free one if None."""
        self.port = free_port() if port is None else port
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{self.port}"
        prefix = [exe] if isinstance(exe, str) else list(exe)
        cmd = [*prefix, "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

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

    def worker(self) -> psutil.Process:
        """The process that runs the model (holds the weights and the KV cache)."""
        return model_process(self.proc.pid)

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


def metric(text: str, name: str, label: str = "") -> float:
    """Sum of a /metrics series over the samples whose labels contain ``label``."""
    pattern = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$"
    return sum(float(v) for labels, v in re.findall(pattern, text, re.M) if label in labels)


def proc_status(pid: int, key: str) -> int:
    """A kB field of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)
