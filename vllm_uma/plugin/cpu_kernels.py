"""What vLLM's CPU kernels need from the process they run in.

``prepare_worker_process`` runs in the worker (the engine-core process with
the ``uni`` executor), from ``UmaWorker.__init__``; ``check_onednn_cap`` in
the API server, from the platform's config hook. Nothing crosses a process
boundary: each reads its own process's environment and CPU.

- AMX tile permission. Linux lets a process execute AMX tile instructions
  only after it asked for the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM,
  XFEATURE_XTILEDATA)``); without it the first tile instruction raises
  SIGILL. vLLM's CPU attention takes its AMX path whenever the CPU has AMX
  tiles (``cpu_attn._get_attn_isa``), and nothing in vLLM's Python asks for
  the permission: oneDNN does, as a side effect, when its own AMX code
  initialises. With oneDNN capped below AMX (``ONEDNN_MAX_CPU_ISA``) on an
  AMX machine the engine core was seen to die on its first request with
  nothing in the log. torch's ``_init_amx`` makes the request; it is
  idempotent and does nothing on a CPU without AMX.
- oneDNN capped too low on an AMX CPU. vLLM 0.32 picks its bf16 linear
  kernels by the CPU alone (``check_cpu_sgl_kernel`` in
  ``vllm/model_executor/layers/utils.py``: AMX tiles present, a weight of
  at most 1 MiB): those call torch's brgemm, which asks oneDNN, which
  honours ``ONEDNN_MAX_CPU_ISA``. Capped below AVX512_CORE_BF16 (AVX2,
  AVX512_CORE, ...) oneDNN has no bf16 brgemm and the engine core aborts on
  the first prompt of a few dozen tokens ("BFloat16 Brgemm VNNI format is
  only supported ..."; measured here, with a packed bf16 linear of 64
  rows, under SSE41, AVX2, AVX2_VNNI, AVX2_VNNI_2, AVX512_CORE and
  AVX512_CORE_VNNI; AVX, between them, was not tried).
  :func:`onednn_cap_refusal` refuses such a start in the API server,
  before any weights load. Names oneDNN does not know it ignores
  (no cap), and so do we; float32 never takes that path.
- A crash says where. A signal that kills the process (SIGILL, SIGSEGV,
  SIGBUS, SIGFPE, SIGABRT) prints every thread's Python stack to stderr,
  which is the server's log, instead of a silent death.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import torch

from vllm_uma.log import get_logger
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.vllm_version import SUPPORTED_VLLM

# The vLLM internal the oneDNN refusal relies on, checked now (vllm_contract/).
vllm_contract.require(__name__)

logger = get_logger(__name__)

ONEDNN_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
# oneDNN's x86 ISA names, lowest first (its "CPU dispatcher control" page;
# the older AVX512_CORE_* spellings of the AVX10 ones are aliases).
ONEDNN_ISAS = (
    "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
    "AVX10_2_512", "AVX10_2_512_AMX_2",
)  # fmt: skip
ONEDNN_ALIASES = {
    "AVX512_CORE_FP16": "AVX10_1_512",
    "AVX512_CORE_AMX": "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16",
}
# The lowest cap under which torch's bf16 brgemm still works here.
LOWEST_BF16_CAP = "AVX512_CORE_BF16"


def onednn_cap_refusal(cap: str | None, amx_tiles: bool, dtype: str) -> str | None:
    """Why vLLM's kernels would abort under ``ONEDNN_MAX_CPU_ISA=cap``, or
    None (see the module's docstring)."""
    if not cap or not amx_tiles or dtype != "bfloat16":
        return None
    name = ONEDNN_ALIASES.get(cap.strip().upper(), cap.strip().upper())
    if name not in ONEDNN_ISAS or ONEDNN_ISAS.index(name) >= ONEDNN_ISAS.index(LOWEST_BF16_CAP):
        return None
    return (
        f"{ONEDNN_CAP_ENV}={cap} caps oneDNN below {LOWEST_BF16_CAP} on a CPU with AMX "
        f"tiles: vLLM {SUPPORTED_VLLM} chooses its bfloat16 linear kernels by the "
        f"CPU (AMX) and torch's brgemm under them refuses bfloat16 under this cap, so the "
        f"engine would abort on its first prompt. Set {ONEDNN_CAP_ENV}={LOWEST_BF16_CAP} or "
        f"higher, unset it, or serve with --dtype float32."
    )


def check_onednn_cap(dtype) -> None:
    """In the API server, before any weights load: refuse a cap vLLM's
    kernels would abort under (a ValueError, like every refusal)."""
    name = str(dtype).removeprefix("torch.")
    cap = os.environ.get(ONEDNN_CAP_ENV)
    reason = onednn_cap_refusal(cap, torch.cpu._is_amx_tile_supported(), name)
    if reason is not None:
        raise ValueError(reason)


def prepare_worker_process() -> None:
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
    if torch.cpu._is_amx_tile_supported():
        if torch.cpu._init_amx():
            logger.info("AMX tile state requested for this process (vLLM's AMX attention).")
        else:
            logger.warning(
                "This CPU has AMX tiles but Linux refused this process the tile "
                "state (arch_prctl ARCH_REQ_XCOMP_PERM); vLLM's AMX attention will "
                "die with SIGILL. Use Linux 5.16 or newer."
            )
