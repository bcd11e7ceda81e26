"""vllm_uma/plugin/compiled_model.py without this CPU's vector ISA: a name
that is no backend is refused, and the platform leaves every configuration
but vLLM CPU's inductor trace alone. What needs the ISA (torch's inductor
finds it by running g++ and a test program in processes of their own):
tests/integration/test_compiled_model_isa.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.config import CompilationMode

from vllm_uma.plugin import compiled_model
from vllm_uma.plugin.platform import load_compiled_model_on_restart


def test_other_names_are_not_backends():
    with pytest.raises(AttributeError):
        compiled_model.no_such_thing  # noqa: B018


def _config(mode, backend):
    return SimpleNamespace(mode=mode, backend=backend)


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
