"""Helpers the KV benchmarks share: prompt text, best-of-N timing, a model's
KV bytes (from its config, never a constant), and the two references a
restore is compared with: memory copy bandwidth, and the disk read
bandwidth measured the way the disk tier reads (block-sized O_DIRECT reads
of separate files on as many threads, page cache dropped).

The benchmarks are one package: run each from the project's root as
``.venv/bin/python -m tools.benchmark.<script>``.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

EXE = str(Path(sys.executable).parent / "vllm-uma")
MODEL = "SmolLM2-135M-Instruct"
BLOCK_TOKENS = 128  # vLLM CPU's KV block
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
WORDS = ["apple", "river", "stone", "cloud", "green", "light", "table", "music"]


def text(seed: int, tokens: int) -> str:
    """About ``tokens`` tokens of plain words (one token each for this
    tokenizer), led by the seed so that two seeds differ from the first
    block on (prefix caching hashes chain from the first block)."""
    return f"{seed} " + " ".join(WORDS[(seed * 7 + k) % 8] for k in range(tokens - 2))


def model_config(model_dir: Path | None = None) -> dict:
    """The model's config.json (the default model's when ``model_dir`` is None)."""
    if model_dir is None:
        from vllm_uma import models

        model_dir = models.prepare()
    return json.loads((Path(model_dir) / "config.json").read_text())


def model_layers(model_dir: Path | None = None) -> int:
    return model_config(model_dir)["num_hidden_layers"]


def kv_bytes_per_token(model_dir: Path | None = None, dtype: str = "bfloat16") -> int:
    """K and V of every layer for one token, from the model's config.json
    (the default model when ``model_dir`` is None): what a running server
    prints as per_block_bytes / block size in its breakdown line."""
    config = model_config(model_dir)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


def kv_row_bytes(model_dir: Path | None = None, dtype: str = "bfloat16") -> int:
    """Bytes of one host-pool row (one disk block file's KV): one block of
    one KV cache group. vLLM puts every layer in one group when all layers
    are alike; when they mix kinds (Gemma 3: 5 sliding-window layers to 1
    full), it makes groups of as many layers as the rarest kind has, one
    group per kind and repeat, and a block is one group's layers."""
    config = model_config(model_dir)
    layers = config["num_hidden_layers"]
    kinds = config.get("layer_types") or []
    per_group = layers
    if len(set(kinds)) > 1:
        per_group = min(kinds.count(kind) for kind in set(kinds))
    return BLOCK_TOKENS * kv_bytes_per_token(model_dir, dtype) // layers * per_group


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


def disk_tier_read_gbps(directory: Path, row_bytes: int, nbytes: int, threads: int) -> float:
    """A reference for the disk tier's restores: the disk read the way the
    tier reads. ``nbytes`` in separate files of one page plus ``row_bytes``
    (a block file: header page, one KV block), page cache dropped, each read
    whole with one O_DIRECT pread into a page-aligned buffer, ``threads`` at
    a time. No checksum, no copy into the pool: what the tier could reach if
    the disk were its only cost. Buffered reads where the volume refuses
    O_DIRECT (tmpfs), as the tier does."""
    page = mmap.PAGESIZE
    size = page + -(-row_bytes // page) * page
    count = max(threads, nbytes // size)
    work = directory / f".disk-tier-probe-{os.getpid()}"
    work.mkdir()
    direct = getattr(os, "O_DIRECT", 0)
    try:
        block = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
        for i in range(count):
            (work / f"{i}.kvb").write_bytes(block)
        drop_page_cache(work)
        buffers = [mmap.mmap(-1, size) for _ in range(threads)]

        def read(i: int) -> int:
            buf = buffers[i % threads]
            path = work / f"{i}.kvb"
            try:
                fd = os.open(path, os.O_RDONLY | direct)
            except OSError:
                fd = os.open(path, os.O_RDONLY)  # no O_DIRECT here: buffered
            try:
                return os.preadv(fd, [buf], 0)
            finally:
                os.close(fd)

        # Thread i reads files i, i + threads, ...: one buffer per thread.
        def worker(t: int) -> int:
            return sum(read(i) for i in range(t, count, threads))

        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            done = sum(pool.map(worker, range(threads)))
        took = time.perf_counter() - start
        for buf in buffers:
            buf.close()
        return done / took / 1e9
    finally:
        for path in work.glob("*"):
            path.unlink()
        work.rmdir()


def disk_tier_args(root_dir: Path, cap_gib: float) -> list[str]:
    """The `vllm-uma serve` flags of a disk tier (L3) at ``root_dir``."""
    tier = {"type": "fs", "root_dir": str(root_dir), "max_size_gib": cap_gib}
    config = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return ["--kv-transfer-config", json.dumps(config)]
