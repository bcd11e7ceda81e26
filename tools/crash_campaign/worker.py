"""One server of the crash campaign: the disk tier under a vLLM-like load.

A forked child of the driver (driver.py). It builds the disk tier the way
the engine core does, says "ready" on a pipe once the tier's start-up (scan,
reconcile, eviction to the cap) is done, then loops until SIGTERM: a run of
1-4 consecutive keys (a prefix) is looked up, the hits loaded, the misses
stored, as vLLM's offloading scheduler would in one step. Keys are drawn
from a universe four times the cap, so most stores evict.

A restore that succeeds with other bytes than its key's, or a job that never
finishes, is a violation: said on stderr as a ``VIOLATION`` line, and the
worker exits with VIOLATION_EXIT. SIGTERM drains the tier and exits 0.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

from tools.harness.parent_death import kill_me_with_my_parent
from vllm_uma import lifeline
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.disk.tier import DiskTier

ROW_BYTES = 4096  # one block's KV bytes (small: many blocks, many evictions)
ROWS = 8  # rows 0-3 take loads, 4-7 stores
NAMESPACE = bytes.fromhex("c7" * 16)
VIOLATION_EXIT = 3
JOB_TIMEOUT_S = 30.0
IO_THREADS = 2


@dataclass(frozen=True)
class WorkerPlan:
    root: Path
    cap_blocks: int
    seed: int
    log_path: Path
    driver_pid: int


def key_of(i: int) -> bytes:
    """An OffloadKey as vLLM makes them: a 32-byte block hash, a group index."""
    return hashlib.sha256(i.to_bytes(8, "big")).digest() + (0).to_bytes(4, "big")


def payload(key: bytes) -> bytes:
    """The bytes every server stores for ``key``."""
    return hashlib.blake2b(key, digest_size=64).digest() * (ROW_BYTES // 64)


def run(plan: WorkerPlan, ready_fd: int, cap_bytes: int) -> None:
    """The child's whole life; never returns (os._exit)."""
    code = 1
    try:
        # First of all: a server frozen (SIGSTOP) before this line would
        # outlive a driver killed then, and the driver may freeze one as soon
        # as it runs (tests/integration/test_crash_campaign.py did, under load). A
        # stopped process runs no thread, so only the kernel can end it; SIGKILL
        # wakes it; the driver forks from its only thread, so the parent-death
        # signal fires when the driver exits.
        kill_me_with_my_parent(plan.driver_pid)
        _redirect_output(plan.log_path)
        code = _serve(plan, ready_fd, cap_bytes)
    except BaseException as exc:  # the log says what, the exit code that it failed
        print(f"worker {os.getpid()} failed: {exc!r}", file=sys.stderr, flush=True)
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _redirect_output(log_path: Path) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The parent's sys.stdout/stderr may be other objects than fds 1 and 2
    # (pytest's capture): write to the log through the fds themselves.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True)
    for handler in logging.getLogger("vllm").handlers:  # vLLM's own, set at import
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sys.stderr)


def _serve(plan: WorkerPlan, ready_fd: int, cap_bytes: int) -> int:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    # Never outlive the driver: lifeline's supervisor watch, as `vllm-uma
    # serve` uses it, stops us as SIGTERM would when the driver exits (the
    # driver's pid, taken before the fork: one gone already counts as gone).
    os.environ[lifeline.SUPERVISOR_ENV] = str(plan.driver_pid)
    lifeline.stop_with_supervisor()
    buffer = mmap.mmap(-1, ROWS * ROW_BYTES)
    view = memoryview(buffer).cast("B", (ROWS, ROW_BYTES))
    config = DiskTierSettings(
        root_dir=plan.root, cap_bytes=cap_bytes, enable_kv_events=False, cap_reason="campaign"
    )
    tier = DiskTier(
        SimpleNamespace(),  # the offloading spec: the base class only keeps it
        view,
        "fs",
        settings=config,
        namespace_id=NAMESPACE,
        namespace_info={"model": "crash-campaign", "kv_dtype": "bytes"},
        io_threads=IO_THREADS,
    )
    os.write(ready_fd, b"r")
    os.close(ready_fd)
    loop = _Loop(tier, buffer, random.Random(plan.seed), universe=4 * plan.cap_blocks)
    while not stopping:
        violation = loop.step()
        if violation is not None:
            print(f"VIOLATION {violation}", file=sys.stderr, flush=True)
            return VIOLATION_EXIT
    tier.drain_jobs()
    tier.get_finished_jobs()
    tier.shutdown()
    print(f"worker {os.getpid()} stopped: {loop.counts}", flush=True)
    return 0


class _Loop:
    """What vLLM's offloading scheduler does with a secondary tier, one
    prefix at a time."""

    def __init__(self, tier: DiskTier, buffer: mmap.mmap, rng: random.Random, universe: int):
        self.tier, self.buffer, self.rng, self.universe = tier, buffer, rng, universe
        self.ctx = ReqContext(req_id=f"campaign-{os.getpid()}")
        self.next_job = 0
        self.counts = dict.fromkeys(("store_jobs_ok", "store_jobs_failed", "restored", "missed"), 0)

    def step(self) -> str | None:
        start = self.rng.randrange(self.universe)
        keys = [key_of((start + j) % self.universe) for j in range(self.rng.randint(1, 4))]
        hits = [k for k in keys if self.tier.lookup(k, self.ctx) is LookupResult.HIT]
        misses = [k for k in keys if k not in hits]
        jobs = {}
        if hits:
            jobs[self._submit(hits, load=True)] = hits
        if misses:
            for row, key in enumerate(misses, start=4):
                self.buffer[row * ROW_BYTES : (row + 1) * ROW_BYTES] = payload(key)
            jobs[self._submit(misses, load=False)] = None
        return self._wait(jobs)

    def _submit(self, keys: list[bytes], *, load: bool) -> int:
        self.next_job += 1
        first = 0 if load else 4
        rows = np.arange(first, first + len(keys), dtype=np.int64)
        job = TransferJob(self.next_job, keys, rows, load, self.ctx)
        (self.tier.submit_load if load else self.tier.submit_store)(job)
        return self.next_job

    def _wait(self, jobs: dict[int, list[bytes] | None]) -> str | None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while jobs:
            for result in self.tier.get_finished_jobs():
                loaded = jobs.pop(result.job_id)
                if loaded is None:  # a store job: all its blocks written, or not
                    self.counts["store_jobs_ok" if result.success else "store_jobs_failed"] += 1
                    continue
                ok = loaded if result.success else list(result.successful_keys or ())
                self.counts["missed"] += len(loaded) - len(ok)
                for key in ok:
                    row = loaded.index(key)
                    got = self.buffer[row * ROW_BYTES : (row + 1) * ROW_BYTES]
                    if got != payload(key):
                        return f"a restore of key {key[:8].hex()} gave other bytes than stored"
                    self.counts["restored"] += 1
            if time.monotonic() > deadline:
                return f"jobs {sorted(jobs)} did not finish in {JOB_TIMEOUT_S:.0f} s"
            time.sleep(0.0005)
        return None
