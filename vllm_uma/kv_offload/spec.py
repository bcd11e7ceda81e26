"""The offloading spec vLLM's OffloadingConnector loads for vllm-uma.

Named in ``kv_connector_extra_config`` as ``spec_name: UmaOffloadingSpec``,
``spec_module_path: vllm_uma.kv_offload.spec`` (the platform writes both when
``--kv-offloading-size`` is given). vLLM builds it twice: in the scheduler
(which calls ``get_manager``) and in the worker (``get_worker``); with the
in-process worker both live in the engine-core process.

Scheduler side: vLLM's own CPUOffloadingManager (chunk allocation, LRU
eviction, events), unchanged. Worker side: our HostPool and HostPoolMover,
instead of vLLM's CUDA-stream worker that refuses to run on CPU.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.mover import HostPoolMover


class UmaOffloadingSpec(CPUOffloadingSpec):
    def __init__(self, config):
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"blocks_per_chunk={self.blocks_per_chunk}: vllm-uma offloads one "
                f"KV block per pool row. Remove 'block_size'/'blocks_per_chunk' "
                f"from kv_connector_extra_config."
            )
        if len(self.tokens_per_block) != 1:
            raise ValueError(
                f"the KV cache has {len(self.tokens_per_block)} groups (a hybrid "
                f"model); vllm-uma offloads single-group KV caches only."
            )
        self._pool: HostPool | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._pool = HostPool(self.num_chunks, self.kv_bytes_per_chunk)
            self._worker = HostPoolMover(kv_caches, self._pool)
        return self._worker
