"""The engine's context on a whole VllmConfig (vllm_uma/plugin/engine_context.py).

An integration test: building a VllmConfig starts a process (vLLM's CPU
platform looks at the CPU). The unit tests use the class without it.
"""

from __future__ import annotations

import copy
import pickle

from vllm_uma.plugin.engine_context import engine_context


def test_the_context_is_not_in_the_configs_hash_repr_or_copies():
    from vllm.config import VllmConfig

    config = VllmConfig()
    before = config.compute_hash()
    context = engine_context(config)
    context.host_pool.open(2, 4096)
    try:
        # Not in the compile-cache key, nor in what vLLM prints of its config.
        assert config.compute_hash() == before
        assert "engine_context" not in repr(config)
        assert engine_context(copy.copy(config)) is context
        for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
            assert engine_context(copied).host_pool.existing() is None
    finally:
        context.host_pool.release()
