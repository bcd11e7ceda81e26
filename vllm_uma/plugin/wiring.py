"""Wired weights: lock the memory the model load created in RAM (mlock2).

On one RAM, memory pressure from the KV cache, the offload pool or another
process could page weights out, and every decode step reads all of them. So
the weights are locked after loading; the KV cache and the pool stay
pageable (they are sized as a ceiling and filled lazily).

Why by address range and not by tensor: vLLM's CPU backend repacks every
linear layer's weight after loading (oneDNN or SGL packed formats) and
replaces the parameter with an empty tensor, so the bytes that matter live in
C++-owned buffers that no Python object exposes. What we can see is the
process's memory map. The worker snapshots ``/proc/self/maps`` before the
load and afterwards locks every writable range that appeared or grew (the
weights, their packed copies, the allocator's growth), with
``MLOCK_ONFAULT`` so that reserved-but-untouched address space is not forced
resident. The KV cache is allocated later and stays pageable: a large one
gets a mapping of its own, but a small one (a few MiB, under glibc's mmap
threshold) can come from heap memory freed inside a range locked here, so
the worker unlocks the KV buffer's pages once it exists (``unlock_range``;
locked pages refuse the KV memory release's ``MADV_DONTNEED`` with EINVAL,
seen with a 9 MiB KV cache). ``wired`` is the kernel's own count (``VmLck``
in /proc/self/status), not our estimate.

mlock needs RLIMIT_MEMLOCK room or CAP_IPC_LOCK; when it is refused the
worker logs how to raise the limit and serves unwired.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import resource
from dataclasses import dataclass

from vllm_uma.memory_release.pages import inward

MLOCK_ONFAULT = 0x01

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_LIBC.mlock2.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
_LIBC.mlock2.restype = ctypes.c_int
_LIBC.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_LIBC.munlock.restype = ctypes.c_int

Range = tuple[int, int]  # [start, end) in bytes


@dataclass(frozen=True)
class WiringResult:
    wired_bytes: int  # VmLck growth, as the kernel counts it
    error: str | None  # why wiring stopped early; None when it completed


def writable_ranges(maps_text: str) -> list[Range]:
    """Writable private or anonymous ranges of a /proc/PID/maps listing.

    Stacks and the kernel's special mappings are left out: they are not
    model memory, and locking a stack's guard area fails.
    """
    ranges = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        span, perms = fields[0], fields[1]
        path = fields[5] if len(fields) == 6 else ""
        if (
            not perms.startswith("rw")
            or path.startswith("[stack")
            or path
            in (
                "[vvar]",
                "[vdso]",
                "[vsyscall]",
            )
        ):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        ranges.append((start, end))
    return ranges


def subtract_ranges(after: list[Range], before: list[Range]) -> list[Range]:
    """Parts of ``after`` not covered by any range of ``before``."""
    before = sorted(before)
    out: list[Range] = []
    for start, end in sorted(after):
        cursor = start
        for b_start, b_end in before:
            if b_end <= cursor or b_start >= end:
                continue
            if b_start > cursor:
                out.append((cursor, b_start))
            cursor = max(cursor, b_end)
            if cursor >= end:
                break
        if cursor < end:
            out.append((cursor, end))
    return out


def read_maps() -> list[Range]:
    with open("/proc/self/maps") as f:
        return writable_ranges(f.read())


def locked_bytes() -> int:
    """VmLck of this process, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    return 0


def mlock_range(start: int, end: int) -> int:
    """Lock [start, end) on fault; returns 0 or the errno."""
    if _LIBC.mlock2(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MLOCK_ONFAULT):
        return ctypes.get_errno()
    return 0


def unlock_range(start: int, end: int) -> int:
    """Unlock the whole pages inside [start, end) (pages shared with a
    neighbour stay as they are); returns 0 or the errno. Unlocking memory
    that is not locked is not an error."""
    pages = inward(start, end)
    if pages is None:
        return 0
    first, last = pages
    if _LIBC.munlock(ctypes.c_void_p(first), ctypes.c_size_t(last - first)):
        return ctypes.get_errno()
    return 0


def wire_new_memory(before: list[Range], expected_bytes: int) -> WiringResult:
    """Lock what was mapped since ``before`` was taken."""
    locked_before = locked_bytes()
    for start, end in subtract_ranges(read_maps(), before):
        err = mlock_range(start, end)
        if err == 0 or (err == errno.ENOMEM and not memlock_limit_applies()):
            # ENOMEM without a limit in force means the range was unmapped
            # since we read the maps: nothing to lock there.
            continue
        wired = locked_bytes() - locked_before
        return WiringResult(wired, explain_refusal(err, expected_bytes, wired))
    return WiringResult(locked_bytes() - locked_before, None)


def memlock_limit_applies() -> bool:
    # root holds CAP_IPC_LOCK, which lifts RLIMIT_MEMLOCK.
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return soft != resource.RLIM_INFINITY and os.geteuid() != 0


def explain_refusal(err: int, expected: int, wired: int) -> str:
    if err in (errno.ENOMEM, errno.EPERM, errno.EAGAIN):
        return (
            f"mlock refused ({errno.errorcode.get(err, err)}) after "
            f"{wired / 2**30:.2f} of {expected / 2**30:.2f} GiB: the "
            f"locked-memory limit is too low (`ulimit -l` is "
            f"{memlock_limit()}). Raise it to at least "
            f"{expected / 2**30:.1f} GiB (`ulimit -l unlimited` in the shell, "
            f"LimitMEMLOCK=infinity for a systemd unit, --ulimit memlock=-1 "
            f"for a container), or pass --no-wire-weights to silence this. "
            f"Serving goes on; the weights can be paged out under pressure."
        )
    return f"mlock failed: {os.strerror(err)}; serving goes on with pageable weights."


def memlock_limit() -> str:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} kB"
