"""tests/unit runs on fakes, in the test's own process: a unit test, its
fixtures included, that starts a process fails here, naming the way out.
What needs a process, root, a mount or a real server lives in
tests/integration/.

Every way Python starts one is refused while a unit test runs (set-up,
call and tear-down): subprocess through Popen, multiprocessing's spawn
through _posixsubprocess.fork_exec, its fork through os.fork, and the rest
through os.system, os.posix_spawn and os.exec*. A process a module starts
while it is imported is let through: it is the library's own (vLLM's import
of py-cpuinfo runs `file` once), made at collection when other modules
import it first, and inside the first test that imports it otherwise.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).parent
OS_STARTERS = ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp", "execv", "execve")
STARTERS = [
    (subprocess.Popen, "__init__", "subprocess.Popen"),
    (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
    *((os, name, f"os.{name}") for name in OS_STARTERS if hasattr(os, name)),
]


class ProcessStarted(AssertionError):
    """A unit test started a process."""


def _importing() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _refuse(test: str, starter: str, real):
    def refused(*args, **kwargs):
        if _importing():
            return real(*args, **kwargs)
        raise ProcessStarted(
            f"{test} starts a process ({starter}): a unit test runs on fakes in this "
            f"process. Move the test to tests/integration/, or give the code a fake "
            f"for the process."
        )

    return refused


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Called for every test of the session (xdist's workers too), not only
    # this folder's.
    if UNIT not in item.path.parents:
        return (yield)
    with pytest.MonkeyPatch.context() as patch:
        for owner, name, starter in STARTERS:
            patch.setattr(owner, name, _refuse(item.nodeid, starter, getattr(owner, name)))
        return (yield)
