"""A process that armed exit_without_collection skips its last garbage
collections: an object in a reference cycle is not finalized at exit, which
is what shows the walk over every object did not happen. Unarmed, the same
process finalizes it (so the test can fail)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import atexit, sys
from vllm_uma.exit_without_collection import arm

class Cycle:
    def __del__(self):
        print("collected", flush=True)

before = atexit._ncallbacks()
if sys.argv[1] == "armed":
    arm()
    arm()  # a second call registers nothing more
print("handlers", atexit._ncallbacks() - before, flush=True)
a = Cycle()
a.self = a  # freed only by a garbage collection
del a
"""


def run(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def test_an_armed_process_exits_without_collecting():
    assert run("armed") == ["handlers 1"]


def test_an_unarmed_process_collects_at_exit():
    assert run("unarmed") == ["handlers 0", "collected"]
