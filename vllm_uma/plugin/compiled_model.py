"""A restart loads its compiled model from vLLM's compile cache.

The problem (vLLM 0.32.0, torch 2.13): vLLM's CPU platform compiles with
``CompilationMode.DYNAMO_TRACE_ONCE`` and torch's ``"inductor"`` backend,
named by string. With ``VLLM_USE_AOT_COMPILE`` (on by default for torch >=
2.10) vLLM saves torch's AOT artifact after the first compile, and at the next
start its loader (``vllm.compilation.decorators._try_load_aot_compiled_fn``)
calls ``compiled_fn.finalize_loading(vllm_config)``: a method of vLLM's own
``VllmSerializableFunction`` (the ``VLLM_COMPILE`` mode's artifact). What
torch returns for a plain inductor compile,
``BundledAOTAutogradSerializableCallable``, has no such method. The load
fails ("Compiling model again due to a load failure"), and every start
compiles again: 45 s of the default model's 48 s engine start-up here.

The fix, through vLLM's own extension point: ``compilation_config.backend``,
which vLLM resolves by qualified name in ``DYNAMO_TRACE_ONCE`` mode
(``CompilationConfig.init_backend``). The platform (``check_and_update_config``,
after vLLM CPU's own choice) names this module's backend instead of the string
``"inductor"``. The backend compiles with inductor exactly as torch does for
that string (``torch._TorchCompileInductorWrapper`` with vLLM CPU's inductor
options) and hands the artifact back as :class:`InductorArtifact`: torch's own
serializable wrapper plus the one method vLLM's loader calls, which has
nothing left to do (deserializing inductor's bundle already loaded its
kernels). Nothing in site-packages is changed.

Process: the engine core, where the model is compiled and run (the ``uni``
executor's worker). The backend's name is the only thing that crosses a
process boundary, as a string in the config.

The CPU kind: vLLM's AOT cache key hashes the config (the backend's name with
it) but not the CPU, and inductor's C++ kernels are generated for one vector
ISA. An artifact written on an AVX-512 machine would die of an illegal
instruction on an AVX2 one, for example after a VM moved hosts or a cache
directory was copied. So the backend's name carries the ISA inductor picks
here (``inductor_avx2``, ``inductor_avx512``, ``inductor_amx`` ...: torch's
``pick_vec_isa``), which puts it into the cache key; a name resolved on a CPU
of another ISA is refused in one line.

Left alone: eager mode, vLLM's ``VLLM_COMPILE`` mode and any backend other
than the string ``"inductor"`` (a user's own choice).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
from torch._inductor.cpu_vec_isa import pick_vec_isa

from vllm_uma.plugin import vllm_contract

# What vLLM's loader calls and how it resolves our name (plugin/vllm_contract/).
vllm_contract.require(__name__)

BACKEND_PREFIX = "inductor_"
MODULE = __name__


class ForeignIsaError(RuntimeError):
    """The compiled-model backend names another CPU's vector ISA."""


def vector_isa() -> str:
    """The vector ISA inductor generates C++ kernels for on this CPU
    ("avx2", "avx512", "amx", "neon", ...; "none" without one)."""
    isa = pick_vec_isa()
    name = str(isa) if isa else "none"
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower())


def backend_qualname(isa: str | None = None) -> str:
    """What the platform writes into ``compilation_config.backend``."""
    return f"{MODULE}.{BACKEND_PREFIX}{isa or vector_isa()}"


def _inductor_options() -> dict[str, Any]:
    # Model construction (where vLLM resolves the backend's name) runs under
    # vLLM's current config: the inductor options it would have passed to
    # torch.compile along with the string "inductor".
    from vllm.config import get_current_vllm_config

    return dict(get_current_vllm_config().compilation_config.inductor_compile_config)


class InductorArtifact(BundledAOTAutogradSerializableCallable):
    """torch's serializable inductor bundle, with the method vLLM's loader calls."""

    # torch wraps any backend result that has a ``serialize`` method in its
    # own class again (torch/_dynamo/aot_compile.py), which would lose this
    # one: it is already the serializable wrapper.
    serialize = None

    def finalize_loading(self, vllm_config: Any) -> None:
        """Called by vLLM after a load; an inductor bundle's kernels were
        loaded by its deserialization already."""


class InductorBackend:
    """A torch.compile backend: torch's inductor with vLLM CPU's options,
    its AOT artifact one that vLLM's loader can finish loading."""

    def __init__(self, isa: str, options: dict[str, Any]) -> None:
        self.isa = isa
        self.__name__ = f"{BACKEND_PREFIX}{isa}"
        # dynamic=False: what vLLM passes to torch.compile (compilation/wrapper.py).
        self._inductor = torch._TorchCompileInductorWrapper(None, options, False)

    def __call__(self, graph_module: Any, example_inputs: Any) -> Any:
        compiled = self._inductor(graph_module, example_inputs)
        # Only under torch's AOT compile (VLLM_USE_AOT_COMPILE) is the result
        # a bundle that serializes; otherwise it is returned as inductor made it.
        if getattr(compiled, "serialize", None) is None:
            return compiled
        return InductorArtifact(compiled)


def __getattr__(name: str) -> Any:
    # vLLM resolves "vllm_uma.plugin.compiled_model.inductor_<isa>" with
    # getattr on this module (resolve_obj_by_qualname): one backend per name,
    # refused on a CPU of another ISA.
    if not name.startswith(BACKEND_PREFIX):
        raise AttributeError(f"module {MODULE!r} has no attribute {name!r}")
    isa = name.removeprefix(BACKEND_PREFIX)
    here = vector_isa()
    if isa != here:
        raise ForeignIsaError(
            f"compilation backend {MODULE}.{name} compiles for the {isa} vector ISA, but "
            f"this CPU's is {here}. Leave --compilation-config's backend unset (vllm-uma "
            f"names {backend_qualname(here)} itself), or set it to that name."
        )
    return InductorBackend(isa, _inductor_options())
