"""A command that dies with the process that started it: ``python -m
tools.peers.exec_tied PARENT_PID -- ARGV...`` sets PR_SET_PDEATHSIG and execs ARGV.

llama-server runs none of our code, so it cannot watch its parent the way
`vllm-uma serve` does (vllm_uma/lifeline.py); a benchmark killed with
SIGKILL would leave it serving. The death signal survives the exec, so the
server is killed when the benchmark's starting thread exits, however it
exits. The benchmark starts its servers from its main thread.
"""

from __future__ import annotations

import os
import sys

from tools.harness.parent_death import kill_me_with_my_parent


def tied_command(argv: list[str]) -> list[str]:
    """``argv`` run through this module, tied to the calling process."""
    return [sys.executable, "-m", "tools.peers.exec_tied", str(os.getpid()), "--", *argv]


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m tools.peers.exec_tied PARENT_PID -- COMMAND [ARGS...]")
    kill_me_with_my_parent(int(args[0]))
    os.execv(args[2], args[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
