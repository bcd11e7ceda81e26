"""vllm_uma/plugin/compiled_model.py on this CPU: the backend's name carries
its vector ISA, a name of another ISA is refused, and the platform names the
backend where vLLM CPU chose torch's inductor by string. torch's inductor
finds the ISA by running g++ and a test program in processes of their own
(once per process). The rest: tests/unit/test_compiled_model.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.config import CompilationMode

from vllm_uma.plugin import compiled_model
from vllm_uma.plugin.platform import load_compiled_model_on_restart


def _config(mode, backend):
    return SimpleNamespace(mode=mode, backend=backend)


def test_the_backend_name_carries_this_cpus_isa():
    isa = compiled_model.vector_isa()
    assert isa and isa.replace("_", "").isalnum()
    assert compiled_model.backend_qualname() == (f"vllm_uma.plugin.compiled_model.inductor_{isa}")


def test_a_backend_of_another_isa_is_refused_with_both_names():
    here = compiled_model.vector_isa()
    other = "amx" if here != "amx" else "avx2"
    with pytest.raises(compiled_model.ForeignIsaError) as err:
        getattr(compiled_model, f"inductor_{other}")
    message = str(err.value)
    assert f"for the {other} vector ISA" in message
    assert f"this CPU's is {here}" in message
    assert compiled_model.backend_qualname(here) in message


def test_the_platform_names_our_backend_for_vllm_cpus_inductor_trace():
    config = _config(CompilationMode.DYNAMO_TRACE_ONCE, "inductor")
    load_compiled_model_on_restart(config)
    assert config.backend == compiled_model.backend_qualname()


def test_a_second_run_of_the_hook_keeps_the_name():
    # vLLM runs the platform hook again in the engine core on the same config.
    config = _config(CompilationMode.DYNAMO_TRACE_ONCE, "inductor")
    load_compiled_model_on_restart(config)
    first = config.backend
    load_compiled_model_on_restart(config)
    assert config.backend == first
