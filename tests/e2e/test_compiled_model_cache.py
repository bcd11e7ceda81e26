"""A compiled function saved by torch's AOT compile and loaded back, the way
vLLM's compile cache does it (vllm/compilation/decorators.py): through
vllm-uma's backend it loads, finishes loading and computes what it computed
before; through torch's own inductor backend, what vLLM CPU uses, the
finishing step vLLM calls does not exist (the bug compiled_model.py avoids).

Integration, not unit: inductor runs the C++ compiler.
"""

from __future__ import annotations

import pytest
import torch

from vllm_uma.plugin.compiled_model import InductorArtifact, InductorBackend, vector_isa

# vLLM CPU's inductor options (vllm/platforms/cpu.py).
CPU_OPTIONS = {"dce": True, "size_asserts": False, "nan_asserts": False}


def layer(x, w):
    return torch.nn.functional.silu(x @ w) * 2.0 + 1.0


def save_and_load(backend, path):
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(layer, fullgraph=True, dynamic=False, backend=backend)
        aot = compiled.aot_compile(((x, w), {}))
    expected = aot(x, w)
    aot.save_compiled_function(str(path))
    with open(path, "rb") as f:
        loaded = torch.compiler.load_compiled_function(f, f_globals=layer.__globals__)
    return loaded, (x, w), expected


def test_our_artifact_loads_and_computes_the_same(tmp_path):
    loaded, args, expected = save_and_load(
        InductorBackend(vector_isa(), dict(CPU_OPTIONS)), tmp_path / "model"
    )
    artifact = loaded._artifacts.compiled_fn
    assert isinstance(artifact, InductorArtifact)
    artifact.finalize_loading(None)  # what vLLM's loader calls
    assert torch.equal(loaded(*args), expected)
    assert torch.allclose(expected, layer(*args), atol=1e-5)


def test_torchs_own_inductor_artifact_cannot_finish_loading(tmp_path):
    loaded, _, _ = save_and_load("inductor", tmp_path / "model")
    with pytest.raises(AttributeError, match="finalize_loading"):
        loaded._artifacts.compiled_fn.finalize_loading(None)
