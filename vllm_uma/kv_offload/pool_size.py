"""The host pool's size as the worker settled it: recorded once, read by the connector.

An automatic pool (no size given by the user) is sized twice: by the
platform in the API server, provisionally, from the whole budget
(kv_offload/config.py), and by the worker once the weights and activations
are measured (``resize_auto_pool``). The worker's size is a result: it is
recorded here under the engine id, and the connector builds the spec from
it (:func:`spec_config`), handing vLLM's spec a copy of the extra config
with that ``cpu_bytes_to_use``. vLLM's own ``kv_connector_extra_config``
keeps the provisional size; nothing edits it after start-up.

Process: the worker's and the connector's. The worker runs
``determine_available_memory`` before the engine core builds either side of
the connector. With the in-process 'uni' executor, which offloading
requires (kv_offload/config.py refuses the others), that is one process,
and both sides see the settled size. Where the worker is elsewhere, nothing
is recorded in this process and the spec is sized from the provisional
size, as vLLM's dict would have sized it.
"""

from __future__ import annotations

import dataclasses
import threading

from vllm_uma.kv_offload.config import OffloadPlan, PoolSize


class SettledPools:
    """The worker's pool size by engine id, in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, PoolSize] = {}

    def record(self, engine_id: str, size: PoolSize) -> None:
        """Set once: a second, different size means two workers disagree."""
        with self._lock:
            known = self._sizes.get(engine_id)
            if known is not None and known.bytes != size.bytes:
                raise ValueError(
                    f"engine {engine_id}: the host pool was settled at {known.bytes} "
                    f"bytes and again at {size.bytes}; one worker settles it once."
                )
            self._sizes[engine_id] = size

    def get(self, engine_id: str) -> PoolSize | None:
        with self._lock:
            return self._sizes.get(engine_id)

    def forget(self, engine_id: str) -> None:
        with self._lock:
            self._sizes.pop(engine_id, None)


SETTLED_POOLS = SettledPools()


def pool_for(engine_id: str, offload: OffloadPlan, settled: SettledPools = SETTLED_POOLS):
    """The pool size the spec is built with: the worker's, when the size was
    ours to settle and the worker settled it here; else the plan's."""
    if offload.pool.auto:
        return settled.get(engine_id) or offload.pool
    return offload.pool


def spec_config(offloading_config, offload: OffloadPlan, settled: SettledPools = SETTLED_POOLS):
    """vLLM's OffloadingConfig for our spec, with the settled pool size.

    A user-given size is left as vLLM wrote it (``--kv-offloading-size`` in
    GiB times 2**30, or cpu_bytes_to_use). An automatic one is the worker's,
    in a copy of the extra config: vLLM's dict is not edited."""
    if not offload.pool.auto:
        return offloading_config
    size = pool_for(offloading_config.engine_id, offload, settled)
    extra = {**offloading_config.extra_config, "cpu_bytes_to_use": size.bytes}
    return dataclasses.replace(offloading_config, extra_config=extra)
