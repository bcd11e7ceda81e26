"""Children never outlive their parent: the ties between vllm-uma's processes.

The processes and who ties whom:
- a supervisor (a test or tool through server_process.Server, the fleet,
  prepare-model's served check) starts ``vllm-uma serve`` in a session of
  its own, so that one signal stops the server and everything it started.
  That also cuts the kernel's usual ties: when the supervisor is SIGKILLed,
  nothing tells the server. Server therefore puts its own pid in
  ``$VLLM_UMA_SUPERVISOR_PID``, and ``vllm-uma serve`` (commands/serve.py)
  calls :func:`stop_with_supervisor`: when that process exits, the server
  stops as a SIGTERM would stop it (its engine core drains the disk tier),
  and exits anyway :data:`GRACE_S` later. A server a user starts from a
  shell has no such variable and is not tied: ``nohup vllm-uma serve &``
  keeps running after the shell exits, as users expect.
- the API server starts vLLM's engine core (vLLM's code, in a process of its
  own, which nothing of vLLM's ties to the API server). ``vllm-uma serve``
  puts its pid in ``$VLLM_UMA_API_SERVER_PID``; the engine core inherits it,
  and :func:`register` (``vllm_uma/__init__.py``), which vLLM calls early in
  every process it starts, calls :func:`follow_api_server`. When the API
  server exits, the engine core stops the way a SIGTERM stops it (we call
  vLLM's handler), but only while that handler is installed: vLLM 0.32
  restores SIG_DFL before its teardown, and a normal stop lets the API
  server exit while the engine core still drains its disk tier, so a signal
  then would kill the drain.
  Either way the engine core exits GRACE_S after its API server.
- vLLM's workers (the 'mp' executor) are tied to the engine core by vLLM
  itself (its death pipe, v1/executor/multiproc_executor.py).
- a program that cannot watch its parent (vllm-router, a Rust binary) runs
  under :func:`shim_command`: a small watcher that starts it, passes SIGTERM
  and SIGINT on, stops it when its supervisor exits and exits with its
  status.

How a process watches its parent: a daemon thread blocked on a pidfd of the
parent (``os.pidfd_open``, Linux 5.3), which becomes readable when that
process exits, whichever thread of it started us; PR_SET_PDEATHSIG would fire
when the *thread* that forked the child exits, and the fleet starts its
servers from pool threads. Where pidfds are missing, the thread polls
``os.getppid()`` every :data:`POLL_S`. A parent that is already gone when
the watch starts (we are reparented) counts as gone.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from vllm_uma.plugin import vllm_contract

# Texts read from vLLM's files: no vLLM module is imported.
vllm_contract.require(__name__)

SUPERVISOR_ENV = "VLLM_UMA_SUPERVISOR_PID"
API_SERVER_ENV = "VLLM_UMA_API_SERVER_PID"
# From the parent's exit to our own at the latest: a graceful stop drains the
# disk tier within 20 s (kv_offload/config.py), plus the model's teardown.
GRACE_S = 60.0
POLL_S = 0.5
# The shim's program: from SIGTERM to SIGKILL when its supervisor is gone.
SHIM_STOP_S = 10.0

# Our loggers are children of vLLM's (vllm_uma/log.py) without importing
# vLLM here: the shim must start in milliseconds.
logger = logging.getLogger("vllm.plugins.vllm_uma.lifeline")
_watching: set[str] = set()  # one watch of each kind per process


def supervised_env() -> dict[str, str]:
    """What a supervisor adds to its child's environment to be followed."""
    return {SUPERVISOR_ENV: str(os.getpid())}


def stop_with_supervisor() -> bool:
    """In ``vllm-uma serve``: stop when the process that started us exits.

    When $VLLM_UMA_SUPERVISOR_PID names our parent, or a process that is
    gone (our parent died before we looked: we stop at once). A value naming
    a live process that is not our parent was inherited from further up and
    ties nothing. Returns whether the watch started."""
    parent = _pid_from(SUPERVISOR_ENV)
    if parent is None or _supervisor_state(parent) == "other":
        return False
    return _watch(
        parent, "supervisor", _stop_self, f"the process that started this server (pid {parent})"
    )


def _supervisor_state(pid: int) -> str:
    """ "parent", "gone" (exited before we looked) or "other" (alive, not ours)."""
    if os.getppid() == pid:
        return "parent"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # alive, another user's
    return "other"


def api_server_pid() -> int | None:
    """In an engine core that `vllm-uma serve` started: its API server's pid
    (from the environment the server set). None in the API server itself,
    and in a process no `vllm-uma serve` started (an offline ``LLM``)."""
    parent = _pid_from(API_SERVER_ENV)
    return None if parent == os.getpid() else parent


def follow_api_server() -> bool:
    """In vLLM's engine core: stop when the API server that started it exits
    (see the module's docstring for when a signal is safe)."""
    parent = api_server_pid()
    if parent is None or _supervisor_state(parent) == "other":
        return False
    return _watch(parent, "api-server", _stop_engine_core, f"the API server (pid {parent})")


def _pid_from(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _watch(parent: int, kind: str, react: Callable[[str], None], who: str) -> bool:
    if kind in _watching:
        return True
    _watching.add(kind)

    def run() -> None:
        wait_for_exit(parent)
        react(who)

    threading.Thread(target=run, name=f"vllm-uma-lifeline-{kind}", daemon=True).start()
    return True


def wait_for_exit(pid: int) -> None:
    """Block until process ``pid``, our parent, has exited."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        # After opening: a parent that exited before was replaced by another
        # parent already, and the pid may belong to someone else by now.
        if os.getppid() != pid:
            return
        if fd is not None:
            select.select([fd], [], [])
            return
        while os.getppid() == pid:
            time.sleep(POLL_S)
    finally:
        if fd is not None:
            os.close(fd)


def _stop_self(who: str) -> None:
    logger.warning(
        "%s has exited; stopping this server as SIGTERM would (its disk tier drains), "
        "at the latest in %.0f s.", who, GRACE_S,
    )  # fmt: skip
    os.kill(os.getpid(), signal.SIGTERM)
    _exit_after_grace(who)


def _stop_engine_core(who: str) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    if _is_python_handler(handler):
        logger.warning(
            "%s has exited; stopping this engine core as SIGTERM would (its disk tier "
            "drains), at the latest in %.0f s.", who, GRACE_S,
        )  # fmt: skip
        # vLLM's handler itself, called here rather than through a signal: it
        # only records the request and wakes the busy loop, so calling it
        # late is harmless, while a SIGTERM that lands after vLLM restored
        # SIG_DFL (between a check and a kill) would end the drain.
        handler(signal.SIGTERM, None)
    # else: vLLM's teardown has begun (or vLLM has not started yet): a signal
    # would kill it; the grace below bounds how long it may take.
    _exit_after_grace(who)


def _is_python_handler(handler) -> bool:
    return callable(handler) and handler is not signal.default_int_handler


def _exit_after_grace(who: str) -> None:
    time.sleep(GRACE_S)
    logger.error(
        "%s exited %.0f s ago and this process has not stopped: exiting now.", who, GRACE_S
    )
    logging.shutdown()
    os._exit(1)


# -- the shim: a watcher for a program that cannot watch its parent ----------


def shim_command(argv: list[str]) -> list[str]:
    """``argv`` run under the watcher. Not ``python -m vllm_uma.lifeline``:
    run as ``__main__``, this module's contract check would name no module."""
    code = "import sys; from vllm_uma.lifeline import run_shim; sys.exit(run_shim(sys.argv[1:]))"
    return [sys.executable, "-c", code, *argv]


def run_shim(argv: list[str]) -> int:
    """Run ``argv`` as our child, tied to our supervisor (see the docstring)."""
    if not argv:
        print("vllm_uma.lifeline: no program to run", file=sys.stderr)
        return 2
    supervisor = _pid_from(SUPERVISOR_ENV)
    # Decided before the program starts: a supervisor that is already gone
    # gets no program that would outlive it.
    state = None if supervisor is None else _supervisor_state(supervisor)
    if state == "gone":
        print(f"vllm_uma.lifeline: the supervisor (pid {supervisor}) has exited; not "
              f"starting {argv[0]}.", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"vllm_uma.lifeline: cannot start {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127

    def forward(signum, _frame) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if state == "parent":

        def stop_child(who: str) -> None:
            print(f"vllm_uma.lifeline: {who} has exited; stopping {argv[0]}.",
                  file=sys.stderr, flush=True)  # fmt: skip
            forward(signal.SIGTERM, None)
            try:
                child.wait(timeout=SHIM_STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()

        _watch(supervisor, "shim", stop_child, f"the supervisor (pid {supervisor})")
    status = child.wait()
    return status if status >= 0 else 128 - status
