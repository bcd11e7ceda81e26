"""Helpers the KV benchmarks share: prompt text, best-of-N timing, and the
two floors a restore is compared with (memory copy and disk read bandwidth).

The scripts beside this file import it by name: run them as
``.venv/bin/python tools/benchmark/<script>.py`` (the script's directory is
then on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

EXE = str(Path(sys.executable).parent / "vllm-uma")
MODEL = "SmolLM2-135M-Instruct"
KV_PER_TOKEN = 23_040  # SmolLM2-135M, bf16: 2 x 30 layers x 3 heads x 64 x 2 B
WORDS = ["apple", "river", "stone", "cloud", "green", "light", "table", "music"]


def text(seed: int, tokens: int) -> str:
    """About ``tokens`` tokens of plain words (one token each for this
    tokenizer), led by the seed so that two seeds differ from the first
    block on (prefix caching hashes chain from the first block)."""
    return f"{seed} " + " ".join(WORDS[(seed * 7 + k) % 8] for k in range(tokens - 2))


def best_of(repeats: int, fn) -> float:
    """The shortest of ``repeats`` timed calls, in seconds: on a shared
    machine the minimum is the figure least disturbed by others."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    """numpy's copy of one contiguous buffer: the floor for moving bytes in RAM."""
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    return nbytes / best_of(repeats, lambda: np.copyto(dst, src)) / 1e9


def drop_page_cache(path: Path) -> int:
    """Evict ``path`` (a file, or every file under a directory) from the page
    cache so that the next read comes from the disk. Returns the bytes
    dropped. Dirty pages cannot be dropped, so everything is synced first."""
    os.sync()
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    dropped = 0
    for file in files:
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile, or not ours to read
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return dropped


def disk_read_gbps(directory: Path, nbytes: int, repeats: int = 2) -> float:
    """Sequential read of a fresh ``nbytes`` file in ``directory`` with its
    pages dropped from the page cache before each read: the floor for
    restoring bytes from a disk tier on that volume."""
    chunk = 8 << 20
    path = directory / f".disk-read-probe-{os.getpid()}"
    block = np.random.default_rng(0).integers(0, 255, chunk, dtype=np.uint8).tobytes()
    try:
        with open(path, "wb") as f:
            for _ in range(0, nbytes, chunk):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        buf = memoryview(bytearray(chunk))

        def read() -> None:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

        times = []
        for _ in range(repeats):
            drop_page_cache(path)
            times.append(best_of(1, read))
        return path.stat().st_size / min(times) / 1e9
    finally:
        path.unlink(missing_ok=True)


def disk_tier_args(root_dir: Path, cap_gib: float) -> list[str]:
    """The `vllm-uma serve` flags of a disk tier (L3) at ``root_dir``."""
    tier = {"type": "fs", "root_dir": str(root_dir), "max_size_gib": cap_gib}
    config = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return ["--kv-transfer-config", json.dumps(config)]
