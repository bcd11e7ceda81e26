"""L1 <-> L2 copy bandwidth of vllm-uma's mover, beside this machine's memcpy.

    .venv/bin/python -m tools.benchmark.kv_pool_bandwidth [--model NAME] [--blocks 64] [--repeats N]
        [--copies streamed|cached]

Uses the real HostPool and HostPoolMover on a KV cache laid out like vLLM's
(one backing buffer) and shaped like the model's (the default model unless
--model names another recipe, a model zoo build such as zoo-qwen3-real or a
model directory; layers and bytes per token read from its config.json;
128-token blocks, bf16; for a model with several KV cache groups, the
layers of one group, which is what a block and a pool row hold), and
compares
with numpy's copy of one contiguous buffer of the same size on as many
threads as the mover copies with: the floor for moving those bytes. The
target is 80% of it. One run, ratios measured in the same process (the
machine is shared); memcpy is taken before and after the mover and the
faster kept.

The copies run as in a server's engine core with KV offloading: glibc
streams copies above 192 KiB past the cache
(vllm_uma/kv_offload/streaming_copies.py; the tool starts itself again
under that GLIBC_TUNABLES). ``--copies cached`` keeps glibc's own threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from vllm.v1.kv_offload.base import CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from tools.benchmark.lib import model_choice
from tools.benchmark.lib.copies_env import copies_environment
from tools.benchmark.lib.floors import best_of, memcpy_gbps
from tools.benchmark.lib.geometry import (
    BLOCK_TOKENS,
    kv_bytes_per_token,
    kv_row_bytes,
    model_layers,
)
from vllm_uma import models
from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.mover import HostPoolMover, default_copy_threads
from vllm_uma.kv_offload.streaming_copies import ENV

TARGET = 0.8  # of memcpy, for both directions


def main() -> int:
    args = parse_args()
    run_with_copies(args.copies)
    n = args.blocks
    model_dir = model_directory(args.model)
    # One layer's share of a block, and the layers a block holds: all of
    # them, or one KV cache group's (vLLM overlays the groups).
    page = kv_bytes_per_token(model_dir) // model_layers(model_dir) * BLOCK_TOKENS
    num_layers = kv_row_bytes(model_dir) // page
    nbytes = n * num_layers * page
    caches, pool = kv_cache_and_pool(num_layers, 4 * n, page)
    gbps = measure(HostPoolMover(caches, pool), n, nbytes, args)
    print(f"transfer: {n} blocks x {num_layers} layers x {page} B = {nbytes / 2**20:.1f} MiB")
    print(f"threads: {default_copy_threads()} (the mover's and memcpy's)")
    print(f"copies: {args.copies} ({ENV}={os.environ.get(ENV, '')!r})")
    print(f"{'copy':8} {'GB/s':>7} {'vs memcpy':>10}")
    for name in ("memcpy", "store", "load"):
        print(f"{name:8} {gbps[name]:7.2f} {gbps[name] / gbps['memcpy']:9.0%}")
    target = all(gbps[k] >= TARGET * gbps["memcpy"] for k in ("store", "load"))
    print(f"target (store and load >= {TARGET:.0%} of memcpy): {'HELD' if target else 'MISSED'}")
    print(
        json.dumps(
            {
                "bytes": nbytes,
                "gbps": gbps,
                "threads": default_copy_threads(),
                "cores": os.cpu_count(),
                "load": os.getloadavg(),
            }
        )
    )
    return 0


def run_with_copies(copies: str) -> None:
    """Start this tool again under the GLIBC_TUNABLES ``copies`` asks for,
    unless it runs under them already (glibc reads them only at start)."""
    env = copies_environment(copies == "streamed")
    if env.get(ENV) != os.environ.get(ENV):
        module = __spec__.name if __spec__ else "tools.benchmark.kv_pool_bandwidth"
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


def model_directory(name: str) -> Path:
    """A recipe's directory (built if missing), else a zoo build's or a
    directory's, as the other benchmarks' --model (lib/model_choice.py)."""
    if name in models.RECIPES:
        return models.prepare(name)
    return model_choice.choose(name).directory


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=models.DEFAULT_MODEL_NAME,
        help=f"whose KV layout is copied: a recipe ({', '.join(models.RECIPES)}), "
        "a model zoo build (python -m tools.model_zoo list) or a model directory",
    )
    ap.add_argument("--blocks", type=int, default=64, help="blocks per transfer")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--copies",
        choices=("streamed", "cached"),
        default="streamed",
        help="streamed: as the engine core copies with KV offloading (glibc's non-temporal "
        "threshold at 192 KiB); cached: glibc's own threshold",
    )
    return ap.parse_args()


def kv_cache_and_pool(
    num_layers: int, num_blocks: int, page: int
) -> tuple[CanonicalKVCaches, HostPool]:
    """A KV cache of ``num_layers`` layers of ``num_blocks`` pages, and a
    host pool of as many rows, resident."""
    # One backing buffer, each layer a view of it, as vLLM allocates the KV
    # cache (the mover then copies all layers of a block at once).
    backing = torch.randint(-128, 127, (num_layers, num_blocks, page), dtype=torch.int8)
    layers = [backing[i] for i in range(num_layers)]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=page) for t in layers],
        group_data_refs=[[]],
    )
    pool = HostPool(num_blocks, num_layers * page)
    pool.array.fill(1)  # resident, like a pool in steady state
    return caches, pool


def measure(mover: HostPoolMover, n: int, nbytes: int, args) -> dict[str, float]:
    """GB/s of a store and a load of ``n`` blocks (``nbytes``), best of
    --repeats, and of memcpy before and after them (the faster kept)."""
    blocks = list(range(0, 2 * n, 2))  # scattered, as L1 blocks are
    rows = list(range(n, 2 * n))

    def store():
        mover.submit_store(1, GPULoadStoreSpec(blocks, [n], [0]), CPULoadStoreSpec(rows))
        mover.wait({1})
        mover.get_finished()

    def load():
        mover.submit_load(2, CPULoadStoreSpec(rows), GPULoadStoreSpec(blocks, [n], [0]))
        mover.wait({2})
        mover.get_finished()

    memcpy_before = memcpy_gbps(nbytes, args.repeats)
    store_s = best_of(args.repeats, store)
    load_s = best_of(args.repeats, load)
    memcpy = max(memcpy_before, memcpy_gbps(nbytes, args.repeats))
    mover.shutdown()
    return {"memcpy": memcpy, "store": nbytes / store_s / 1e9, "load": nbytes / load_s / 1e9}


if __name__ == "__main__":
    raise SystemExit(main())
