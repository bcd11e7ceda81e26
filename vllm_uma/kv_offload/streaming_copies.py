"""The engine core's KV copies stream past the CPU cache (glibc's non-temporal threshold).

Where it runs: in the API server, from the platform's config hook, when KV
offloading is planned. What crosses to the engine core is one environment
variable, ``GLIBC_TUNABLES``: vLLM's CPU platform starts the engine core
with ``spawn`` (a new exec of Python) after the hook, and its glibc reads the
variable as it starts. The API server's own glibc read its tunables at its
own start, so nothing changes there.

Why. The mover copies a block as one piece per layer per run of blocks
(mover.py): 512 KiB for Qwen3-0.6B's 28 layers x 8 KV heads x 128 in
bfloat16 (and for Llama 3, Mistral, Qwen2.5-7B's 4 KV heads, 256 KiB; 96
KiB for SmolLM2). glibc's ``memcpy`` writes through the cache up to its
non-temporal threshold (every destination line is read before it is
written) and streams above it; glibc derives the threshold from the cache
sizes, 182 MiB on this machine. So every piece took the slow way: a 4k-token
prefix of Qwen3-0.6B (455 MB) moved 12.7 GB/s on two threads where one copy
of the same bytes moved 22.5 GB/s. Above a threshold of 192 KiB the mover
moved 18.6 GB/s (store) and 20.6 GB/s (load)
(tools/benchmark/kv_pool_bandwidth.py --model zoo-qwen3-real --blocks 31).
With the step that waits for its load (mover.py), a pool restore of that
prefix went from 1.22x an L1 hit to 1.04x; each change alone gained little
(docs/benchmark.md, "Streaming copies and a step that waits for its load").

Why 192 KiB and not lower: every copy in the process above the threshold
streams, the forward's too, and a streamed copy's destination is read back
from RAM. With 64 KiB (SmolLM2's pieces stream as well) a 4k-token prefill
of Qwen3-0.6B's configuration was 6-8% slower in both rounds of
tools/benchmark/forward_copies.py; with 192 KiB, 1.5-4% slower and decode
1-2% slower, inside the 3-7% those figures move between rounds of the
same setting. SmolLM2's restores are a fifth of the size and keep glibc's
own threshold.

A user's own value of the same tunable wins; it is kept, and the log says
so (in the API server, and again in the engine core, which runs the hook
again). Only glibc on x86-64 has this tunable; elsewhere nothing is set,
and nothing is set when vLLM runs the engine in the API server's own
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), whose glibc has started.
"""

from __future__ import annotations

import platform
from collections.abc import MutableMapping

ENV = "GLIBC_TUNABLES"
TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
# glibc streams a copy strictly larger than this: 256 KiB pieces (4 KV
# heads x 128 in bfloat16, or 8 in fp8) and up do; glibc's floor is 0x4040.
THRESHOLD_BYTES = 192 << 10
SETTING = f"{TUNABLE}={THRESHOLD_BYTES:#x}"


def applies(machine: str | None = None, libc: str | None = None) -> bool:
    """glibc on x86-64: the only place the tunable exists."""
    machine = platform.machine() if machine is None else machine
    libc = platform.libc_ver()[0] if libc is None else libc
    return machine in ("x86_64", "AMD64") and libc == "glibc"


def stream_engine_copies(
    environ: MutableMapping[str, str], machine: str | None = None, libc: str | None = None
) -> str | None:
    """Add the threshold to ``environ``'s GLIBC_TUNABLES, for the processes
    started after this. Returns a line for the log saying what was set, or
    that the user's own value of the tunable is kept; None when nothing
    applies or the value is ours already."""
    if not applies(machine, libc):
        return None
    current = environ.get(ENV, "")
    items = [item for item in current.split(":") if item]
    # An item without a value is ignored by glibc, and so here.
    theirs = [item for item in items if item.partition("=")[0] == TUNABLE and "=" in item]
    if not theirs:
        environ[ENV] = ":".join([*items, SETTING])
        return (
            f"KV offloading: the engine core copies KV blocks with streaming stores "
            f"above {THRESHOLD_BYTES >> 10} KiB ({ENV} gets {SETTING}; docs/kv_offloading.md)."
        )
    if theirs[-1] == SETTING:
        return None  # ours, inherited (the hook runs again in the engine core)
    return (
        f"KV offloading: {ENV} sets {theirs[-1]}, kept; vllm-uma would set "
        f"{SETTING} so that the engine core's KV copies stream past the cache "
        f"(docs/kv_offloading.md)."
    )
