"""The precision ``--dtype auto`` serves in: float32 on a CPU without bf16 arithmetic.

vLLM CPU 0.32 lists bfloat16 first among the dtypes of every x86 CPU
(``CpuPlatform.supported_dtypes``: "x86/aarch64 CPU has supported both bf16
and fp16 natively"), so ``--dtype auto`` serves a bf16 checkpoint in bf16
and downcasts a float32 one to bf16. Only AVX512_BF16 and AMX compute in
bf16; on an AVX2 CPU (AMD Zen 2/3, most desktop Intel parts) and on
AVX-512 without BF16 (Skylake-SP, Cascade Lake) every bf16 matmul widens
its operands in software. Measured on an AVX2 AMD EPYC (one thread, torch
2.13's ``F.linear`` at SmolLM2-135M's MLP shape): a decode-sized product
(1 x 576 by 576 x 1536) took 0.71 ms in bf16 against 0.29 ms in float32,
a prefill-sized one (128 rows) 72 ms against 8.4 ms; the served figures
are in docs/serving.md ("Precision").

Where it acts: ``UmaPlatform.supported_dtypes``, the list vLLM's
``ModelConfig`` asks when it resolves ``auto`` (``_resolve_auto_dtype``:
the checkpoint's dtype if listed, else the first listed). On a CPU without
bf16 arithmetic the list is float32 alone, so ``auto`` resolves to float32
for any checkpoint. An explicit ``--dtype bfloat16`` (or float16) is not
checked against that list by vLLM and is served as asked: half the
weights' and the KV cache's memory, at the speed above. vLLM then logs its
own "doesn't support torch.bfloat16. Falling back to torch.float32" for
``auto``, and for an explicit bf16 a once-only warning that the head dtype
falls back to the model's (the same dtype: nothing changes); the
platform's config hook adds one line that says why (:func:`auto_note`), in
the API server only (the engine core runs the hook again), and not when
the command line gave ``--dtype``.

Process: every vLLM process (API server, engine core) builds its config
and reads its own CPU; nothing crosses a process boundary. On aarch64,
POWER and RISC-V vLLM's own list stays: their bf16 support is told by
other flags, which vLLM reads.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Sequence

import torch

# What vLLM CPU 0.32 lists first on x86; what we list on a CPU without bf16.
FLOAT32_ONLY = [torch.float32]
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")


@functools.cache
def has_bf16_arithmetic() -> bool:
    """Whether this CPU computes in bfloat16 (AVX512_BF16 or AMX tiles), or
    is not x86 (where vLLM's own checks apply)."""
    if platform.machine().lower() not in X86_MACHINES:
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def supported_dtypes(vllm_list: list[torch.dtype], bf16_arithmetic: bool) -> list[torch.dtype]:
    """The dtypes vLLM may pick for ``--dtype auto``, best first."""
    return list(vllm_list) if bf16_arithmetic else list(FLOAT32_ONLY)


def dtype_given(argv: Sequence[str]) -> bool:
    """Whether a command line chooses the dtype (``--dtype X`` or
    ``--dtype=X``, X not ``auto``): vLLM's config keeps only the dtype it
    resolved, not whether the user asked for it, and the API server's argv
    is the user's. ``--dtype auto`` leaves the choice to us, as no flag
    does, so the float32 line is still said."""
    for i, arg in enumerate(argv):
        if arg == "--dtype":
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith("--dtype="):
            value = arg.split("=", 1)[1]
        else:
            continue
        if value.strip().lower() != "auto":
            return True
    return False


def auto_note(dtype: torch.dtype, bf16_arithmetic: bool, given: bool = False) -> str | None:
    """The line that says why a model is served in float32, or None: none
    where the CPU computes in bf16, where another dtype is served, or where
    the user gave ``--dtype`` (``given``) and so chose it."""
    if bf16_arithmetic or dtype != torch.float32 or given:
        return None
    return (
        "Serving in float32: this CPU has no bfloat16 arithmetic (no AVX512_BF16, no AMX), "
        "where vLLM's bf16 matmuls are several times slower than float32 ones "
        "(docs/serving.md, Precision). --dtype bfloat16 halves the weights' and the KV "
        "cache's memory at that cost."
    )
