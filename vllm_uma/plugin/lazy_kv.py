"""Lazy KV-cache allocation: the KV buffer costs RAM only where it is written.

vLLM allocates the KV cache's one backing buffer with ``torch.zeros``
(``vllm.v1.worker.utils.allocate_kv_cache``). The memset makes every page of
a multi-GiB buffer resident at start-up, although most blocks are never used.
``torch.empty`` leaves the pages untouched: the kernel commits each page when
a block is first written, so RSS follows the tokens actually cached.

Skipping the memset is safe for uniform-precision attention caches: attention
masks every slot past a sequence's length, so unwritten bytes never reach an
output. vLLM's ``KVCacheConfig.needs_kv_cache_zeroing`` says when it is not
safe (Mamba state is read before it is fully written; mixed-precision caches
can reinterpret stale bytes as NaN): then the allocation stays zeroed.

How: vLLM lets the worker run the allocation inside a context manager (the
``kv_cache_allocation_context`` of ``initialize_kv_cache``). Inside it a torch
function mode turns ``torch.zeros`` into ``torch.empty`` for that one call
site's duration, so the buffer and its per-layer views are built by vLLM's own
``allocate_kv_cache`` and ``create_kv_cache_views``: same shape, stride,
storage offset and dtype by construction (tests/unit/test_lazy_kv.py checks
it against vLLM's zeroed allocation). A torch function mode is thread-local,
so other threads allocating meanwhile are not affected.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from vllm_uma.plugin import vllm_contract

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


class LazyZerosMode(TorchFunctionMode):
    """Within this mode, ``torch.zeros(...)`` returns ``torch.empty(...)``."""

    def __init__(self) -> None:
        super().__init__()
        self.intercepted_bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros:
            tensor = torch.empty(*args, **kwargs)
            self.intercepted_bytes += tensor.numel() * tensor.element_size()
            return tensor
        return func(*args, **kwargs)
