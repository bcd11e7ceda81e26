"""What this CPU computes in, read from /proc/cpuinfo without importing torch.

``vllm-uma serve``'s preflight refuses what vLLM CPU cannot run before
vLLM or torch is imported (10-40 s here), so it cannot ask torch. It reads
the same CPU flags torch's answers come from (cpuinfo, through the
kernel's list in /proc/cpuinfo):

- ``avx512``: ``torch.cpu._is_avx512_supported()``, AVX-512 F, VL, BW and
  DQ (ATen's ``is_avx512_supported``). vLLM CPU loads its AVX-512 library
  when it is true and its AVX2 one (``_C_AVX2``) when not
  (``CpuPlatform.import_kernels``);
- ``bf16_arithmetic``: AVX512_BF16 or AMX tiles, what
  ``precision.py``'s ``has_bf16_arithmetic`` asks torch: without it
  ``--dtype auto`` serves in float32.

On another architecture than x86, or without /proc/cpuinfo, nothing is
known (None) and callers leave the decision to vLLM.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")  # as precision.py
AVX512 = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq"})
BF16 = ("avx512_bf16", "amx_tile")  # either one


@dataclass(frozen=True)
class CpuFeatures:
    avx512: bool
    bf16_arithmetic: bool

    def describe(self) -> str:
        if not self.avx512:
            return "no AVX-512"
        return "AVX-512 with bfloat16" if self.bf16_arithmetic else "AVX-512 without bfloat16"


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's flags (every core of a machine has the same)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def from_flags(flags: frozenset[str]) -> CpuFeatures:
    return CpuFeatures(
        avx512=AVX512 <= flags,
        bf16_arithmetic=any(flag in flags for flag in BF16),
    )


def read(cpuinfo: Path = CPUINFO, machine: str | None = None) -> CpuFeatures | None:
    """This x86 CPU's features, or None when they cannot be told here."""
    machine = platform.machine() if machine is None else machine
    if machine.lower() not in X86_MACHINES:
        return None
    try:
        flags = parse_flags(cpuinfo.read_text(errors="replace"))
    except OSError:
        return None
    return from_flags(flags) if flags else None
