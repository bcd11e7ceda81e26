"""Which op computes 4-bit GPTQ layers: ``VLLM_UMA_INT4_KERNEL``, read without vLLM.

``torch`` (the default): PyTorch's CPU int4 matmul, through our kernel
(int4_linear.py, in the engine core); ``vllm``: vLLM's own
``cpu_gemm_wna16``. Read here, with no vLLM import, so that ``vllm-uma
serve``'s preflight refuses a bad value before vLLM loads
(commands/preflight_int4.py), and the engine core reads the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CHOICE_ENV = "VLLM_UMA_INT4_KERNEL"
CHOICES = ("torch", "vllm")


def chosen(environ: Mapping[str, str] = os.environ) -> str:
    """'torch' or 'vllm'; ValueError naming the value, the rule and the fix."""
    value = environ.get(CHOICE_ENV, "").strip().lower() or "torch"
    if value not in CHOICES:
        raise ValueError(
            f"{CHOICE_ENV}={value!r} is invalid: it must be 'torch' (PyTorch's CPU int4 "
            f"matmul, the default) or 'vllm' (vLLM's cpu_gemm_wna16). Set one or unset it."
        )
    return value
