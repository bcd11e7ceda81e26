"""Server's ports and stop, with real processes: a server whose self-chosen
port was taken before it bound it starts again on another port, a bounded
number of times, and a port the caller chose is refused, not replaced; a
stop does not wait for zombies that nobody reaps yet. free_port() alone:
tests/unit/test_server_ports.py.

The "server" here is a small script that runs vllm-uma's real port check
(commands/preflight.py) and then answers /health, so the retry is driven by
the same refusal a real `vllm-uma serve` prints.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from vllm_uma import server_process
from vllm_uma.server_process import Server, free_port

FAKE_SERVE = Path(__file__).with_name("fake_serve.py")


@pytest.fixture()
def fake_serve():
    return [sys.executable, str(FAKE_SERVE)]


def listener() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    return holder


def test_a_taken_port_is_replaced_by_a_new_one(fake_serve, tmp_path, monkeypatch):
    taken = listener()
    picks = iter([taken.getsockname()[1]])
    real = server_process.free_port
    monkeypatch.setattr(server_process, "free_port", lambda: next(picks, None) or real())
    server = Server(fake_serve, [], tmp_path / "server.log")
    try:
        server.wait_ready(timeout=30)
        assert server.port != taken.getsockname()[1]
    finally:
        server.stop()
        taken.close()


def test_the_retries_are_bounded(fake_serve, tmp_path, monkeypatch):
    holders = [listener() for _ in range(server_process.PORT_TAKEN_RETRIES + 1)]
    picks = iter([h.getsockname()[1] for h in holders])
    monkeypatch.setattr(server_process, "free_port", lambda: next(picks))
    server = Server(fake_serve, [], tmp_path / "server.log")
    try:
        with pytest.raises(RuntimeError, match="is already in use"):
            server.wait_ready(timeout=30)
    finally:
        server.stop()
        for holder in holders:
            holder.close()


def test_a_port_the_caller_chose_is_not_replaced(fake_serve, tmp_path):
    taken = listener()
    server = Server(fake_serve, [], tmp_path / "server.log", port=taken.getsockname()[1])
    try:
        with pytest.raises(RuntimeError, match="is already in use"):
            server.wait_ready(timeout=30)
    finally:
        server.stop()
        taken.close()


ORPHAN_ZOMBIE = """
import os, signal, time
if os.fork() == 0:
    os._exit(0)  # a child its parent never waits for: a zombie of the group
time.sleep(60)
"""


def test_a_group_of_zombies_counts_as_stopped():
    # The stop waits for the server's session to exit; a zombie holds
    # nothing, and the init that adopts a session's orphans may take a
    # second or more to reap them.
    import os
    import signal
    import subprocess
    import time

    leader = subprocess.Popen([sys.executable, "-c", ORPHAN_ZOMBIE], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not any(
            pgrp == leader.pid and gone for pgrp, gone in server_process._process_groups()
        ):
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.05)
        assert server_process._group_alive(leader.pid)  # the leader still runs
        os.kill(leader.pid, signal.SIGKILL)
        while leader.pid not in _zombies():
            assert time.monotonic() < deadline, "the leader was not killed"
            time.sleep(0.05)
        os.killpg(leader.pid, 0)  # the group still exists: its members are zombies
        assert not server_process._group_alive(leader.pid)
    finally:
        leader.kill()
        leader.wait()


LEADER_GONE_THREAD_LEFT = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(60,)).start()
time.sleep(0.2)
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends, the process does not
"""


def test_a_zombie_leader_with_a_thread_left_still_counts_as_running():
    # Its state is Z as soon as its own thread ends; its other threads may
    # still hold the address space (an engine core freeing its KV cache).
    import os
    import signal
    import subprocess
    import time

    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER_GONE_THREAD_LEFT], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while leader.pid not in _zombies():
            assert time.monotonic() < deadline, "the main thread never ended"
            time.sleep(0.05)
        assert server_process._group_alive(leader.pid)  # a thread is left
        os.kill(leader.pid, signal.SIGKILL)
        while server_process._group_alive(leader.pid):
            assert time.monotonic() < deadline, "a killed process still counts as running"
            time.sleep(0.05)
    finally:
        leader.kill()
        leader.wait()


def _zombies() -> set[int]:
    return {pid for pid, state in _states() if state == "Z"}


def _states():
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            yield int(entry.name), stat.rsplit(b") ", 1)[1][:1].decode()
