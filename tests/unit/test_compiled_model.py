"""vllm_uma/plugin/compiled_model.py: the backend's name carries this CPU's
vector ISA, a name of another ISA is refused, and the platform names the
backend only where vLLM CPU chose torch's inductor by string."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.config import CompilationMode

from vllm_uma.plugin import compiled_model
from vllm_uma.plugin.platform import load_compiled_model_on_restart


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


def test_other_names_are_not_backends():
    with pytest.raises(AttributeError):
        compiled_model.no_such_thing  # noqa: B018


def _config(mode, backend):
    return SimpleNamespace(mode=mode, backend=backend)


def test_the_platform_names_our_backend_for_vllm_cpus_inductor_trace():
    config = _config(CompilationMode.DYNAMO_TRACE_ONCE, "inductor")
    load_compiled_model_on_restart(config)
    assert config.backend == compiled_model.backend_qualname()


@pytest.mark.parametrize(
    "mode, backend",
    [
        (CompilationMode.NONE, "inductor"),  # eager
        (CompilationMode.DYNAMO_TRACE_ONCE, "eager"),  # VLLM_CPU_CI_ENV
        (CompilationMode.DYNAMO_TRACE_ONCE, "my.own.backend"),  # the user's
        (CompilationMode.VLLM_COMPILE, "inductor"),  # vLLM's own artifact loads
    ],
)
def test_every_other_configuration_is_left_alone(mode, backend):
    config = _config(mode, backend)
    load_compiled_model_on_restart(config)
    assert config.backend == backend


def test_a_second_run_of_the_hook_keeps_the_name():
    # vLLM runs the platform hook again in the engine core on the same config.
    config = _config(CompilationMode.DYNAMO_TRACE_ONCE, "inductor")
    load_compiled_model_on_restart(config)
    first = config.backend
    load_compiled_model_on_restart(config)
    assert config.backend == first
