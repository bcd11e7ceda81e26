"""Test kit for the L3 disk tier: a tiny primary tier, a tier factory and job
helpers (the volume-fault tests' real ext4: tests/integration/volume_kit.py).

The primary tier is 8 rows x 8192 bytes, as vLLM hands it to a secondary
tier: a 2-D memoryview whose ``strides[0]`` is the row size. The offloading
spec is a stand-in: the base class only keeps it.
"""

from __future__ import annotations

import logging
import mmap
import struct
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob

from vllm_uma.kv_offload.disk import io_tasks, reports
from vllm_uma.kv_offload.disk.block_file import HEADER_BYTES, file_bytes
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.disk.tier import DiskTier

ROWS, ROW = 8, 8192
FILE = file_bytes(ROW)  # bytes one block takes on disk
NS = bytes.fromhex("11" * 16)
OTHER_NS = bytes.fromhex("22" * 16)
CTX = ReqContext(req_id="r1")


def key(i: int) -> bytes:
    """An OffloadKey: 32-byte block hash + 4-byte group index."""
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


class Primary:
    """The primary tier's rows; ``aligned`` gives an mmap (O_DIRECT-able)."""

    def __init__(self, aligned: bool = False):
        self.buffer = mmap.mmap(-1, ROWS * ROW) if aligned else bytearray(ROWS * ROW)
        self.view = memoryview(self.buffer).cast("B", (ROWS, ROW))

    def fill(self, row: int, seed: int) -> bytes:
        data = bytes((seed * 7 + i) % 256 for i in range(ROW))
        self.buffer[row * ROW : (row + 1) * ROW] = data
        return data

    def row(self, row: int) -> bytes:
        return bytes(self.buffer[row * ROW : (row + 1) * ROW])

    def clear(self) -> None:
        self.buffer[:] = bytes(ROWS * ROW)


def make_tier(
    root: Path,
    primary: Primary,
    *,
    cap_blocks: int | None = None,
    ns: bytes = NS,
    events: bool = True,
    io_threads: int = 2,
    full_disk=None,
    secret_file: str | None = None,
    **tier_kw,
) -> DiskTier:
    config = DiskTierSettings(
        root_dir=root,
        cap_bytes=None if cap_blocks is None else cap_blocks * FILE,
        enable_kv_events=events,
        cap_reason="test",
        secret_file=secret_file,
    )
    return DiskTier(
        SimpleNamespace(),
        primary.view,
        "fs",
        settings=config,
        namespace_id=ns,
        namespace_info={"model": "test-model", "kv_dtype": "bfloat16"},
        io_threads=io_threads,
        full_disk=full_disk,
        **tier_kw,
    )


class Jobs:
    """Submits jobs with fresh ids and waits for their results."""

    def __init__(self, tier: DiskTier):
        self.tier = tier
        self.next_id = 0
        self.results: dict[int, JobResult] = {}

    def _job(self, keys: list[bytes], rows: list[int], load: bool) -> TransferJob:
        self.next_id += 1
        return TransferJob(self.next_id, keys, np.array(rows, dtype=np.int64), load, CTX)

    def store(self, keys: list[bytes], rows: list[int]) -> int:
        job = self._job(keys, rows, load=False)
        self.tier.submit_store(job)
        return job.job_id

    def load(self, keys: list[bytes], rows: list[int]) -> int:
        job = self._job(keys, rows, load=True)
        self.tier.submit_load(job)
        return job.job_id

    def wait(self, *job_ids: int, timeout: float = 10.0) -> list[JobResult]:
        deadline = time.monotonic() + timeout
        while not all(j in self.results for j in job_ids):
            for result in self.tier.get_finished_jobs():
                assert result.job_id not in self.results, "a job reported twice"
                self.results[result.job_id] = result
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs {job_ids} did not finish in {timeout} s")
            time.sleep(0.0005)
        return [self.results[j] for j in job_ids]

    def stored(self, keys: list[bytes], rows: list[int]) -> JobResult:
        return self.wait(self.store(keys, rows))[0]

    def loaded(self, keys: list[bytes], rows: list[int]) -> JobResult:
        return self.wait(self.load(keys, rows))[0]


def block_files(root: Path) -> list[Path]:
    return sorted((root / ".noindex").rglob("*.kvb"))


def set_format_version(path: Path, version: int) -> None:
    """Rewrite a block file's header as a writer of ``version`` made it: the
    version field, and for version 1 zlib's crc32 of the payload."""
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<H", version))
        if version == 1:
            f.seek(HEADER_BYTES)
            crc = zlib.crc32(f.read())
            f.seek(12)
            f.write(struct.pack("<I", crc))


def counters(stats) -> dict:
    """Stats payload as {(name, labels): value}."""
    data = {} if stats is None else stats.data["data"]
    return {(name, labels): v for name, by in data.items() for labels, v in by.items()}


class WarningLog(logging.Handler):
    """Warnings of the disk tier, or of ``logger`` (vLLM's loggers do not
    reach caplog)."""

    LEVEL = logging.WARNING

    def __init__(self, logger: logging.Logger | None = None):
        super().__init__(self.LEVEL)
        self.messages: list[str] = []
        self._logger = reports.logger if logger is None else logger
        self._saved_level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> WarningLog:
        self._saved_level = self._logger.level
        self._logger.setLevel(min(self.LEVEL, self._logger.getEffectiveLevel()))
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved_level)


class InfoLog(WarningLog):
    """The disk tier's INFO lines too (its start-up and stop lines)."""

    LEVEL = logging.INFO


def held_io(monkeypatch, name: str) -> threading.Event:
    """Make the I/O tasks' ``io_tasks.<name>`` (read_block or write_block)
    wait until the returned event is set: a load or store kept in flight."""
    release = threading.Event()
    real = getattr(io_tasks, name)

    def held(*args, **kw):
        release.wait(10)
        real(*args, **kw)

    monkeypatch.setattr(io_tasks, name, held)
    return release
