"""One context per engine (plugin/engine_context.py), found on the VllmConfig both sides get."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

from vllm_uma.kv_offload import spec
from vllm_uma.plugin.engine_context import EngineContext, engine_context


def test_every_piece_given_one_config_finds_one_context():
    config, other = SimpleNamespace(), SimpleNamespace()
    context = engine_context(config)  # the worker, first in vLLM's start-up order
    assert engine_context(config) is context  # a connector, the scheduler, later
    assert engine_context(other) is not context  # another engine's


def test_vllms_config_carries_it_and_its_copies_start_empty():
    from vllm.config import VllmConfig

    # vLLM's class without its __post_init__, which starts a process to
    # look at the CPU (tests/integration/test_engine_context_vllm_config.py builds a
    # whole one and checks its hash).
    config = object.__new__(VllmConfig)
    context = engine_context(config)
    context.host_pool.open(2, 4096)
    try:
        assert engine_context(config) is context
        assert engine_context(copy.copy(config)) is context  # vLLM's multi-connector copy
        # Pickled for another process, deep-copied for another engine: empty.
        for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
            fresh = engine_context(copied)
            assert fresh is not context and fresh.host_pool.existing() is None
    finally:
        context.host_pool.release()


def test_the_worker_sides_spec_keeps_its_mover_in_the_context(monkeypatch):
    made = []
    monkeypatch.setattr(spec, "make_mover", lambda s, caches, context: made.append(caches) or s)
    context = EngineContext()
    built = spec.UmaOffloadingSpec.__new__(spec.UmaOffloadingSpec)
    built._context = context
    assert built.get_worker("caches") is built
    assert built.get_worker("caches again") is built  # vLLM asks once; a second ask reuses it
    assert made == ["caches"] and context.mover is built
