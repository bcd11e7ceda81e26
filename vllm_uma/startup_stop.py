"""A stop while ``vllm-uma serve`` starts is honoured at once.

What vLLM 0.32 does with SIGTERM and SIGINT before it serves: its API
server raises KeyboardInterrupt from a handler (``_interrupt_init`` for
SIGTERM, Python's default for SIGINT) while it waits for the engine core
in pyzmq polls (``wait_for_engine_startup``, ``MPClient.__init__``). pyzmq
runs the handler inside its EINTR check and drops what it raises
(``_check_rc`` ignores ``PyErr_CheckSignals``' result and retries the
poll), so the stop is lost: measured, a server SIGTERMed 20 s into its
start came up and served. The engine core records a stop that arrives
while it is being built and acts on it only once it is built (by design,
``run_engine_core``): up to a minute here.

What we do: in the API server of ``vllm-uma serve`` (the platform's config
hook calls :func:`arm` there, after vLLM installed its handler and before
it starts the engine core), SIGTERM and SIGINT run :func:`_stop_now`
until vLLM starts serving, when its own handlers replace ours
(``loop.add_signal_handler`` in ``serve_http``, and so for gRPC). Only in
vLLM's single async API server, the one that replaces them: the hook must
run inside its event loop (headless mode, several API servers and the DP
supervisor build the config outside one, and are left as vLLM makes them).
The handler does not raise (it would be dropped too): it logs one line,
SIGKILLs the engine core and everything it started, runs the clean-ups
registered with :func:`on_stop` (the private KV-events socket), and ends
this process by the same signal, as a process without a handler would
end: supervisors see a clean stop.

Why a SIGKILL loses nothing here: before vLLM serves, no request has run,
so no KV block was computed and no store is queued; the disk tier's
start-up (scan, reconcile, eviction) is safe to kill at any point (the
crash campaign kills servers mid-start-up, docs/faults.md). vLLM's
resource tracker is left to exit by itself when we do: it unlinks what
shared memory the engine leaves.

Processes: the API server only. Nothing crosses a process boundary but
the signals. A plain ``vllm serve`` with the plugin and the ``LLM`` class
keep vLLM's behaviour: only ``vllm-uma serve`` marks its process
($VLLM_UMA_API_SERVER_PID, lifeline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable

import psutil

from vllm_uma import lifeline
from vllm_uma.plugin import vllm_contract

# The vLLM texts this relies on (when its handler goes in and goes away).
vllm_contract.require(__name__)

logger = logging.getLogger("vllm.plugins.vllm_uma.startup_stop")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_cleanups: list[Callable[[], None]] = []
_armed = False


def on_stop(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` if the process ends in :func:`_stop_now` (atexit
    handlers do not run then)."""
    _cleanups.append(cleanup)


def arm() -> bool:
    """In ``vllm-uma serve``'s API server, before the engine core starts:
    SIGTERM and SIGINT stop the server at once. Returns whether it armed."""
    global _armed
    if os.environ.get(lifeline.API_SERVER_ENV) != str(os.getpid()):
        return False  # not vllm-uma serve's API server
    if threading.current_thread() is not threading.main_thread():
        return False  # only the main thread may install handlers
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        # Not vLLM's async API server (headless, several API servers, the
        # DP supervisor: their parents build the config outside a loop), so
        # nothing of vLLM's would replace our handlers once it serves.
        return False
    if not _armed:
        for signum in STOP_SIGNALS:
            signal.signal(signum, _stop_now)
        _armed = True
    return True


def _stop_now(signum: int, _frame) -> None:
    name = signal.Signals(signum).name
    engines = engine_processes()
    logger.warning(
        "%s while the server starts: it has served nothing, so nothing is to be "
        "drained; stopping the engine core (pid %s) now and exiting.",
        name, ", ".join(str(p.pid) for p in engines) or "not started",
    )  # fmt: skip
    for proc in engines:
        kill_tree(proc)
    for cleanup in _cleanups:
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - the others still run; we exit next
            logger.exception("a clean-up at the stop failed")
    logging.shutdown()  # the line above reaches the log before we go
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def engine_processes() -> list[psutil.Process]:
    """What vLLM started with multiprocessing: the engine core (the resource
    tracker is not one of them, and stays)."""
    found = []
    for child in multiprocessing.active_children():
        try:
            found.append(psutil.Process(child.pid))
        except (psutil.Error, TypeError):
            continue  # gone, or never started
    return found


def kill_tree(proc: psutil.Process) -> None:
    """SIGKILL ``proc`` and every process under it, children first being
    found before the parent dies (they are reparented after)."""
    try:
        tree = [*proc.children(recursive=True), proc]
    except psutil.Error:
        tree = [proc]
    for each in tree:
        with contextlib.suppress(psutil.Error):  # gone already
            each.kill()
    psutil.wait_procs(tree, timeout=5)
