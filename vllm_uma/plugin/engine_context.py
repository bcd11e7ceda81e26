"""One engine's context: what the scheduler side and the worker side of one engine core share.

Process. vllm-uma offloads KV, and releases KV memory, with vLLM's
in-process 'uni' executor (the platform keeps a single worker in the
engine-core process; kv_offload/refusals.py refuses the other executors
when offloading is on). So the worker (plugin/worker.py), the worker-side
connector with its spec and mover, the scheduler
(memory_release/scheduler.py) and the scheduler-side connector with its
spec and manager all run in the engine-core process, and share one
:class:`EngineContext`. This is the one place that assumption is stated.
Where the worker runs elsewhere anyway (a user's executor with the KV
memory release on and offloading off), the scheduler side finds an empty
context: no L1 page map (the release is off, with a warning), and, were
offloading on, no host pool (the tiered spec refuses to build its manager)
and no final pool size (the spec is sized from the plan's provisional
size).

What it holds, who writes and who reads it:

    what               written by (when)               read by
    final pool size    the worker, once                both connectors, to size
                       (determine_available_memory)    their spec (pool_size.py)
    host pool (L2)     opened by the worker-side       borrowed by the scheduler-side
                       spec's mover (get_worker),      manager (spec.PoolRegion) and
                       closed by its last user         the releasing scheduler: one
                                                       counted reference each
    L1 page map        the worker (initialize_from_    the release thread, under the
                       config); closed by it at        map's lock
                       shutdown                        (memory_release/l1_pages.py)
    mover              the worker-side spec            the worker-side connector
                       (get_worker)                    (get_finished: an idle step
                                                       waits for a load)

Threads: everything is set and read on the engine core's main thread, but
the page map, which the release thread (uma-kv-release) reads each tick
under the map's own lock (the worker closes it under that lock before the
KV cache is freed). The pool's count and the final size take a lock too:
cheap, and the releases come in no fixed order (the manager's shutdown, the
mover's, the releasing scheduler's once its thread has stopped).

Who creates it, and how both sides find it. vLLM builds the connector, and
with it the offloading spec, once per side: two connectors and two specs,
which share nothing of ours; and the worker records the final pool size
before either exists. What every piece receives is the same ``VllmConfig`` object:
the engine core hands its own to the 'uni' executor, which hands it to the
worker (checked by the contract), which hands it to the worker-side
connector; the engine core hands the same object to the scheduler, which
hands it to the scheduler-side connector. The context rides on that object,
as the one attribute :data:`ATTRIBUTE`, made by the first piece that asks
(:func:`engine_context`); in vLLM 0.32's start-up order (``EngineCore.__init__``):

 1. the executor builds the worker and loads the model;
 2. ``_initialize_kv_caches``: the worker's ``determine_available_memory``
    records an automatic pool's final size (the context is made here; with a size
    the user gave, by the worker-side connector next); its
    ``initialize_from_config`` builds the worker-side connector and spec
    (sized from the final size), allocates the KV cache and registers it
    (the spec's mover opens the host pool), then leaves the L1 page map;
 3. the scheduler: the scheduler-side connector and spec (the same size),
    whose manager borrows the pool; the releasing scheduler borrows it too
    and reads the page map.

The connectors hand the context to their spec (spec.make_spec), the spec
to its mover and manager; no piece looks it up by a name of its own. A
``VllmConfig`` that is pickled or deep-copied (for another process or
another engine) carries an empty context: what one holds belongs to this
process. A shallow copy (``copy.copy``, as vLLM's multi-connector makes)
shares it; a ``dataclasses.replace`` has none, and no piece of ours is
given one.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from vllm_uma.kv_offload.host_pool import SharedPool
from vllm_uma.memory_release.l1_pages import L1PageRegistry
from vllm_uma.plugin import vllm_contract

if TYPE_CHECKING:
    from vllm_uma.kv_offload.mover import HostPoolMover
    from vllm_uma.kv_offload.pool_size import PoolSize

# vLLM behaviour relied on, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)

# The one attribute vllm-uma adds to vLLM's VllmConfig object (not a field:
# vLLM neither hashes, compares nor prints it).
ATTRIBUTE = "vllm_uma_engine_context"


class EngineContext:
    """What one engine core's scheduler side and worker side share (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool_size: PoolSize | None = None
        self.host_pool = SharedPool()
        self.l1_pages = L1PageRegistry()
        self.mover: HostPoolMover | None = None

    def record_pool_size(self, size: PoolSize) -> None:
        """The automatic pool's final size, the worker's. Set once: a second,
        different size means two workers disagree."""
        with self._lock:
            known = self._pool_size
            if known is not None and known.bytes != size.bytes:
                raise ValueError(
                    f"the host pool's final size was recorded as {known.bytes} bytes and again "
                    f"as {size.bytes}; one worker records it once."
                )
            self._pool_size = size

    @property
    def pool_size(self) -> PoolSize | None:
        """The worker's final size; None before, or with the worker elsewhere."""
        with self._lock:
            return self._pool_size

    def __reduce__(self):
        # Pickle and deepcopy: the copy is another process's or another
        # engine's, and starts empty (a mapping and addresses are not data).
        return (EngineContext, ())


def engine_context(vllm_config) -> EngineContext:
    """The context of the engine ``vllm_config`` belongs to: made on the
    first call and attached to the config, the same object every later call.

    Every piece that calls this (the worker, the connectors, the releasing
    scheduler) runs on the engine core's main thread, so the first-call
    check needs no lock."""
    context = getattr(vllm_config, ATTRIBUTE, None)
    if context is None:
        context = EngineContext()
        setattr(vllm_config, ATTRIBUTE, context)
    return context
