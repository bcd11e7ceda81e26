"""What the worker process sets up before vLLM's CPU kernels first run.

Runs in the worker (the engine-core process with the ``uni`` executor),
from ``UmaWorker.__init__``; nothing crosses a process boundary.

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
- A crash says where. A signal that kills the process (SIGILL, SIGSEGV,
  SIGBUS, SIGFPE, SIGABRT) prints every thread's Python stack to stderr,
  which is the server's log, instead of a silent death.
"""

from __future__ import annotations

import faulthandler
import sys

import torch

from vllm_uma.log import get_logger

logger = get_logger(__name__)


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
