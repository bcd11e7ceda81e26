"""What `memory_pressure` samples while it runs, and how long the server took
to give its KV back. Every 0.5 s: the server's resident KV and RSS,
MemAvailable and PSI; around the hog, the kernel's OOM kills.

Runs in the benchmark's process (the sampler on a thread of its own),
reading the server from outside (/proc).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil

from vllm_uma.memory_release.pressure import read_psi_some_total
from vllm_uma.memory_release.resident import kv_resident

PSI_MEMORY = Path("/proc/pressure/memory")


class Sampler(threading.Thread):
    """Samples the server's resident KV, its RSS and MemAvailable every
    0.5 s, with the phase. Resident KV: the kernel's page count of the KV
    cache's and the pool's mappings (vllm_uma.memory_release.resident)."""

    def __init__(self, pid: int, breakdown: dict, row_bytes: int):
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.kv = (breakdown["kv_cache"], breakdown["kv_offload_pool"], row_bytes)
        self.phase = "ready"
        self.samples: list[dict] = []
        self._halt = threading.Event()
        self.t0 = time.monotonic()
        first = kv_resident(pid, *self.kv)
        if not (first.found_l1 and first.found_pool):
            raise RuntimeError(f"KV mappings not found in /proc/{pid}/smaps: {first}")

    def run(self) -> None:
        while not self._halt.wait(0.5):
            self.samples.append(self.sample())

    def sample(self) -> dict:
        kv = kv_resident(self.process.pid, *self.kv)
        return {
            "t": round(time.monotonic() - self.t0, 2),
            "phase": self.phase,
            "l1": kv.l1,
            "pool": kv.pool,
            "kv": kv.total,
            "rss": self.process.memory_info().rss,
            "available": psutil.virtual_memory().available,
            "psi_some_us": read_psi_some_total(PSI_MEMORY),
        }

    def stop(self) -> None:
        self._halt.set()
        self.join()


def oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


# The hog's allocation step (memory_common.ram_holder).
HOG_STEP = 256 << 20


def seconds_to_give_back(samples: list[dict], idle: int) -> float | None:
    """From pressure onset to resident KV at or under 20% of the idle figure;
    None if it never got there.

    Onset: the first sample at which either signal the server acts on says
    pressure, read here on their own: MemAvailable under 10% of RAM, or some
    task stalled on memory 10% or more of the time since the previous
    sample (PSI's cumulative total); or, where the server acted between two
    samples so that none saw the mark crossed, the first sample within one
    step of the hog's allocation (HOG_STEP) of it: the next step crossed it."""
    low = psutil.virtual_memory().total * 0.10
    onset = None
    for prev, cur in zip(samples, samples[1:], strict=False):
        stalled = None
        if prev["psi_some_us"] is not None and cur["psi_some_us"] is not None:
            elapsed_us = (cur["t"] - prev["t"]) * 1e6
            stalled = (cur["psi_some_us"] - prev["psi_some_us"]) / elapsed_us if elapsed_us else 0
        if cur["available"] < low or (stalled is not None and stalled >= 0.10):
            onset = cur["t"]
            break
    if onset is None:
        near = (s for s in samples if s.get("phase") == "hog" and s["available"] < low + HOG_STEP)
        onset = next((s["t"] for s in near), None)
    if onset is None:
        return None
    done = next((s["t"] for s in samples if s["t"] >= onset and s["kv"] <= idle * 0.2), None)
    return None if done is None else round(done - onset, 2)
