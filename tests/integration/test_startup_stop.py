"""A stop while the server starts (vllm_uma/startup_stop.py), on a stand-in
API server: a real process that waits in a real pyzmq poll, as vLLM's does
for its engine core, with a real child that ignores the stop, as vLLM's
engine core does while it is built."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

STAND_IN = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    import zmq

    def engine_core():
        # vLLM's engine core records a stop while it is built, acts later.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        time.sleep(60)

    def interrupt_init(*_):  # vLLM's start-up SIGTERM handler
        raise KeyboardInterrupt("terminated")

    if __name__ == "__main__":
        os.environ["VLLM_UMA_API_SERVER_PID"] = str(os.getpid())
        signal.signal(signal.SIGTERM, interrupt_init)
        if sys.argv[1] == "armed":
            import asyncio
            from vllm_uma import startup_stop

            async def platform_hook():  # vLLM builds its config in its loop
                return startup_stop.arm()

            assert asyncio.run(platform_hook())
            marker = sys.argv[2]
            startup_stop.on_stop(lambda: open(marker, "w").close())
        core = multiprocessing.get_context("fork").Process(target=engine_core, daemon=True)
        core.start()
        socket = zmq.Context().socket(zmq.PULL)
        socket.bind("inproc://engine")
        print(core.pid, flush=True)
        try:
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.poll(30_000)  # vLLM waits here for its engine core
            print("the poll returned", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """
)


def start_stand_in(mode: str, marker) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, mode, str(marker)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    core_pid = int(proc.stdout.readline())
    time.sleep(0.5)  # into the poll
    return proc, core_pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.mark.parametrize("way", ["sigterm", "ctrl_c"])
def test_a_stop_while_waiting_for_the_engine_ends_both_processes_at_once(tmp_path, way):
    marker = tmp_path / "cleaned-up"
    proc, core = start_stand_in("armed", marker)
    try:
        started = time.monotonic()
        if way == "sigterm":  # systemd, docker, the fleet: the API server alone
            proc.send_signal(signal.SIGTERM)
        else:  # a terminal: the whole process group
            os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(10)
        assert time.monotonic() - started < 5
        # Ended by the signal itself, as without a handler: a clean stop.
        assert status == -(signal.SIGTERM if way == "sigterm" else signal.SIGINT)
        deadline = time.monotonic() + 5
        while not gone(core) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(core)  # the engine core, which ignored the stop
        assert marker.exists()  # the clean-ups ran (the KV-events socket)
    finally:
        kill_group(proc)


def test_without_it_pyzmq_drops_the_stop_and_the_wait_goes_on(tmp_path):
    # Why startup_stop exists: vLLM's handler raises inside pyzmq's poll,
    # which drops the exception and polls again. If this starts failing,
    # pyzmq passes the exception on and startup_stop may be retired.
    proc, core = start_stand_in("plain", tmp_path / "unused")
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert proc.poll() is None  # still waiting: the stop was lost
        assert not gone(core)
    finally:
        kill_group(proc)
        psutil.wait_procs([psutil.Process(core)] if not gone(core) else [], timeout=5)
