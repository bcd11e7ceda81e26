"""A vLLM process of ours exits without its last garbage collection.

Python's shutdown collects garbage over every object still alive: for a
process that imported vLLM and torch that walk took 1.5 s in the engine
core and as long again in the API server here, every time a server
stopped (py-spy showed ``gc_collect_main`` under ``Py_FinalizeEx``). It
frees nothing the kernel would not free a moment later.

:func:`arm` registers ``gc.freeze`` as an exit handler: it moves every
tracked object into the permanent generation, which no collection walks,
so the shutdown's collections find nothing to do. Exit handlers run last
registered first; by the time this one runs, vLLM's handlers and logging's
flush have run with every object alive.

Armed only on a stop on purpose, after the server served: the API server
once vLLM's serve command returned without an error (commands/serve.py),
the engine core once its scheduler shut down (memory_release/scheduler.py).
A process that fails (a refused flag, a budget too small) exits as before:
with the collection, some libraries' leak reports (nanobind's, for
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

_armed = False


def arm() -> None:
    """Once per process: later calls do nothing."""
    global _armed
    if not _armed:
        atexit.register(gc.freeze)
        _armed = True
