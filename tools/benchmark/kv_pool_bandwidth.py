"""L1 <-> L2 copy bandwidth of vllm-uma's mover, beside this machine's memcpy.

    .venv/bin/python tools/benchmark/kv_pool_bandwidth.py [--blocks 64] [--repeats 10]

Uses the real HostPool and HostPoolMover on a KV cache shaped like the
default model's (30 layers, 128-token blocks of 96 KiB per layer, bf16), and
compares with numpy's copy of one contiguous buffer of the same size: the
floor for moving those bytes. The issue's target is at least half of it.
One run, ratios measured in the same process (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from bench_common import best_of
from vllm.v1.kv_offload.base import CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_uma.kv_offload.host_pool import HostPool
from vllm_uma.kv_offload.mover import HostPoolMover

LAYERS, PAGE = 30, 128 * 3 * 64 * 2 * 2  # SmolLM2-135M, bf16: 98,304 B


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=64, help="blocks per transfer")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    n = args.blocks
    num_blocks = 4 * n
    layers = [torch.randint(-128, 127, (num_blocks, PAGE), dtype=torch.int8) for _ in range(LAYERS)]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=PAGE) for t in layers],
        group_data_refs=[[]],
    )
    pool = HostPool(num_blocks, LAYERS * PAGE)
    pool.array.fill(1)  # resident, like a pool in steady state
    mover = HostPoolMover(caches, pool)
    blocks = list(range(0, 2 * n, 2))  # scattered, as L1 blocks are
    rows = list(range(n, 2 * n))
    nbytes = n * LAYERS * PAGE

    def store():
        mover.submit_store(1, GPULoadStoreSpec(blocks, [n], [0]), CPULoadStoreSpec(rows))
        mover.wait({1})
        mover.get_finished()

    def load():
        mover.submit_load(2, CPULoadStoreSpec(rows), GPULoadStoreSpec(blocks, [n], [0]))
        mover.wait({2})
        mover.get_finished()

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    memcpy_s = best_of(args.repeats, lambda: np.copyto(dst, src))
    store_s = best_of(args.repeats, store)
    load_s = best_of(args.repeats, load)
    mover.shutdown()

    gbps = {
        k: nbytes / v / 1e9 for k, v in (("memcpy", memcpy_s), ("store", store_s), ("load", load_s))
    }
    print(f"transfer: {n} blocks x {LAYERS} layers x {PAGE} B = {nbytes / 2**20:.1f} MiB")
    print(f"{'copy':8} {'GB/s':>7} {'vs memcpy':>10}")
    for name in ("memcpy", "store", "load"):
        print(f"{name:8} {gbps[name]:7.2f} {gbps[name] / gbps['memcpy']:9.0%}")
    target = all(gbps[k] >= 0.5 * gbps["memcpy"] for k in ("store", "load"))
    print(f"target (store and load >= 50% of memcpy): {'HELD' if target else 'MISSED'}")
    print(
        json.dumps(
            {"bytes": nbytes, "gbps": gbps, "cores": os.cpu_count(), "load": os.getloadavg()}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
