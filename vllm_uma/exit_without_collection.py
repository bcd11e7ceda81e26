"""A vLLM process of ours exits without its last garbage collection.

Python's shutdown collects garbage over every object still alive: for a
process that imported vLLM and torch that walk took 1.5 s in the engine
core and as long again in the API server here, every time a server
stopped (py-spy showed ``gc_collect_main`` under ``Py_FinalizeEx``). It
frees nothing the kernel would not free a moment later.

:func:`arm` registers ``gc.freeze`` as an exit handler: it moves every
tracked object into the permanent generation, which no collection walks,
so the shutdown's collections find nothing to do. Exit handlers run last
registered first, and this one is registered when vLLM first loads the
plugin (vllm_uma.register), so it runs after vLLM's own handlers and
logging's flush, which still see every object. What it gives up: a
finalizer (``__del__``) of an object caught in a reference cycle no
longer runs at exit. Nothing of ours relies on one: what a server must
write before it exits (the disk tier's pending blocks) is written by its
stop, not by a finalizer, and file descriptors are closed by the kernel.
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
