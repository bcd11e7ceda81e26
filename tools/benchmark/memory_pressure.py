"""`memory_benchmark.py --pressure`: KV memory that follows the working set.

Phases on one `vllm-uma serve` (default model, utilization 0.5, a host pool
and a disk tier; the release settings as given, idle release after
``--idle-seconds``):

  burst    distinct prompts, ``--burst-tokens`` in all (max_tokens 8);
  idle     no request for idle-seconds + 10 s: the idle release runs;
  hog      a helper process allocates and touches MemAvailable minus
           ``--hog-leave-gib``, holds it ``--hog-seconds``, then exits;
  revisit  the first ``--revisit`` prompts again (max_tokens 8).

The same phases run first on a reference server with the feature off
(``release_free_kv`` false, ``memory_pressure`` off), without the hog: its
revisits are L1 hits of the same prompts, the fair reference for the
feature's restores (same prefix split, bf16).

Resident KV is the kernel's count of the pages of the KV cache's mapping
and of the host pool's (smaps Rss; vllm_uma/memory_release/resident.py),
with the engine core's RSS beside it. Sampled every 0.5 s, drawn in a PNG
beside the JSON. Live KV is what the server
says it keeps (its last "KV kept:" log line). OOM kills: /proc/vmstat's
oom_kill before and after. Hit tokens by tier: the deltas of
vllm:prompt_tokens_cached_by_source_total over the revisits.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from vllm_uma.memory_release.pressure import read_psi_some_total
from vllm_uma.memory_release.resident import kv_resident

GiB = 1 << 30
PSI_MEMORY = Path("/proc/pressure/memory")
KEPT_RE = re.compile(r"KV memory: .* KV kept: ([\d.]+) GiB")
SOURCE_RE = re.compile(
    r'^vllm:prompt_tokens_cached_by_source_total\{.*source="(\w+)"\} ([\d.e+]+)$'
)


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


def cached_by_source(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in map(SOURCE_RE.match, text.splitlines()) if m}


def complete(port: int, model: str, prompt: list[int], max_tokens: int = 8) -> tuple[list, int]:
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 0,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return out["choices"][0]["logprobs"]["tokens"], out["usage"]["prompt_tokens"]


def run_hog(leave_gib: float, hold_s: float, say) -> subprocess.Popen:
    """Allocate MemAvailable - leave_gib in 256 MiB steps (touched), hold, exit."""
    want = int(psutil.virtual_memory().available - leave_gib * GiB)
    code = (
        "import time\n"
        f"want = {want}; step = 256 << 20; held = []\n"
        "while sum(map(len, held)) < want:\n"
        "    held.append(bytearray(b'\\x01') * min(step, want - sum(map(len, held))))\n"
        "print('held', flush=True)\n"
        f"time.sleep({hold_s})\n"
    )
    say(f"hog: allocating {want / GiB:.2f} GiB, holding {hold_s:.0f} s")
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
