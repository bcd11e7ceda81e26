"""A vLLM process of ours exits without its last garbage collection.

Python's shutdown collects garbage over every object still alive: for a
process that imported vLLM and torch that walk took 1.5 s in the engine
core and as long again in the API server here, every time a server
stopped (py-spy showed ``gc_collect_main`` under ``Py_FinalizeEx``). It
frees nothing the kernel would not free a moment later.

:func:`arm` registers ``gc.freeze`` as an exit handler: it moves every
tracked object into the permanent generation, which no collection walks,
so the shutdown's collections find nothing to do. Exit handlers run last
registered first, so this one, registered at the stop, runs before vLLM's
and logging's; that is harmless: freezing frees nothing, those handlers
run as before, and what they create afterwards is still collectable.

Armed only on a stop on purpose, after the server served: the API server
once vLLM's serve command returned without an error (commands/serve.py);
the engine core once its scheduler shut down with no exception in flight
but vLLM's SystemExit(0) of a stop (``run_engine_core`` also shuts the
engine down after a fatal error), and only in an engine core that
`vllm-uma serve` started, never in a process that runs the engine
in-process (an offline ``LLM``). The engine core's part needs vllm-uma's
scheduler (memory_release/scheduler.py), which the platform installs
unless the memory release is turned off; without it the engine core exits
with its collection, as before. A process that
fails (a refused flag, a budget too small, a fatal engine error) exits as
before: with the collection, some libraries' leak reports (nanobind's, for
triton's objects) print at exit when their objects are not collected, and
the error must stay the last line the user sees.

What it gives up: a finalizer (``__del__``) of an object caught in a
reference cycle no longer runs at exit. Nothing of ours relies on one:
what a server must write before it exits (the disk tier's pending blocks)
is written by its stop, not by a finalizer, and the kernel closes file
descriptors.
"""

from __future__ import annotations

import atexit
import gc
import sys

from vllm_uma.lifeline import api_server_pid

_armed = False


def arm() -> None:
    """Once per process: later calls do nothing."""
    global _armed
    if not _armed:
        atexit.register(gc.freeze)
        _armed = True


def arm_engine_core() -> None:
    """:func:`arm`, from the engine core's shutdown, when it is a stop on
    purpose of an engine core that `vllm-uma serve` started (its API
    server's pid is in the environment and is not ours). On purpose: no
    exception in flight but the SystemExit with status 0 by which vLLM's
    busy loop ends on a stop signal (``run_engine_core`` shuts the engine
    down in its ``finally``, after a fatal error too). vLLM does the same
    freeze itself after a clean stop, on ROCm only (vllm/v1/engine/core.py,
    0.32.0)."""
    in_flight = sys.exc_info()[1]
    if in_flight is not None and not (
        isinstance(in_flight, SystemExit) and in_flight.code in (None, 0)
    ):
        return
    if api_server_pid() is not None:
        arm()
