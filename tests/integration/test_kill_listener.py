"""tools/benchmark/lib/servers.kill_listener: the fleet benchmarks' staged
death kills the whole process group listening on a URL's port, and refuses
to pretend when nothing listens there."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tools.benchmark.lib.servers import kill_listener

# A listener with a child in its group, as an API server with its engine core.
LISTENER = """
import socket, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_the_listener_and_its_group_are_killed():
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        port, child = (int(x) for x in proc.stdout.readline().split())
        kill_listener(f"http://127.0.0.1:{port}")
        assert proc.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child too, should an assert fail first
        proc.wait(timeout=10)


def test_nothing_listening_is_an_error_not_a_death():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        with pytest.raises(RuntimeError, match=f"no process listens on http://127.0.0.1:{port}"):
            kill_listener(f"http://127.0.0.1:{port}")
