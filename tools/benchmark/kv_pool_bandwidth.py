"""L1 <-> L2 copy bandwidth of vllm-uma's mover, beside this machine's memcpy.

    .venv/bin/python -m tools.benchmark.kv_pool_bandwidth [--model NAME] [--block-size 32]
        [--blocks N] [--repeats N] [--copies streamed|cached]

Uses the real HostPool and HostPoolMover on a KV cache laid out like vLLM's
(one backing buffer) and shaped like the model's (the default model unless
--model names another recipe, a model zoo build such as zoo-qwen3-real or a
model directory; layers and bytes per token read from its config.json;
bf16; for a model with several KV cache groups, the layers of one group,
which is what a block and a pool row hold) in blocks of ``--block-size``
tokens (default vllm-uma's, 32: plugin/block_size.py; 128 is vLLM CPU's,
to compare), and compares
with numpy's copy of one contiguous buffer of the same size on as many
threads as the mover copies with: the floor for moving those bytes. A
transfer is ``--blocks`` blocks, by default 8,192 tokens of KV (256 blocks
of 32, 64 of 128: the same bytes at every block size, 180 MiB of the
default model's), every other block of L1 (scattered, as L1's are). The
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
    add_block_size_argument,
    kv_bytes_per_token,
    kv_row_bytes,
    model_layers,
)
from vllm_uma import models
from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.mover import HostPoolMover, default_copy_threads
from vllm_uma.kv_offload.streaming_copies import ENV

TARGET = 0.8  # of memcpy, for both directions
TRANSFER_TOKENS = 8192  # a transfer's default: 64 blocks of 128 tokens, 256 of 32


def main() -> int:
    args = parse_args()
    run_with_copies(args.copies)
    block = args.block_size
    n = args.blocks or TRANSFER_TOKENS // block
    model_dir = model_directory(args.model)
    num_layers, page = block_layout(model_dir, block)
    nbytes = n * num_layers * page
    caches, pool = kv_cache_and_pool(num_layers, 4 * n, page)
    gbps = measure(HostPoolMover(caches, pool), n, nbytes, args)
    print(
        f"transfer: {n} blocks of {block} tokens x {num_layers} layers x {page} B = "
        f"{nbytes / 2**20:.1f} MiB"
    )
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
                "block_tokens": block,
                "blocks": n,
                "gbps": gbps,
                "threads": default_copy_threads(),
                "cores": os.cpu_count(),
                "load": os.getloadavg(),
            }
        )
    )
    return 0


def block_layout(model_dir: Path, block_tokens: int) -> tuple[int, int]:
    """(layers a block holds, one layer's bytes of a block) for blocks of
    ``block_tokens``: all layers, or one KV cache group's (vLLM overlays
    the groups)."""
    page = kv_bytes_per_token(model_dir) // model_layers(model_dir) * block_tokens
    return kv_row_bytes(model_dir, block_tokens=block_tokens) // page, page


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
    add_block_size_argument(ap)
    ap.add_argument(
        "--blocks",
        type=int,
        default=None,
        help=f"blocks per transfer (default: {TRANSFER_TOKENS:,} tokens' worth)",
    )
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
