"""What the network tier's MAC costs: each candidate on a block, and a restore with it.

    .venv/bin/python -m tools.benchmark.mac_cost [--block-bytes 737280 3670016]
        [--blocks 125] [--rounds 5] [--repeats 7]

Every value the network tier writes is signed and every value it restores is
checked (vllm_uma/kv_offload/block_mac.py), on its transfer threads, so the
MAC must be cheap beside a restore and must release the GIL. Two parts:

1. Candidates on a page-aligned block of random bytes of a real block's size
   (by default the default model's, 32 tokens x 23,040 B in bfloat16 =
   737,280 B, and Qwen3-0.6B's, 32 x 114,688 B = 3,670,016 B), one thread,
   hot, best of ``--repeats``, and whether a call releases the GIL
   (checksum_speed.py's probe: 100 means held). crc32c is the reference
   (what a restore pays already).
2. The restore path: the real network tier (tier.py) on a real KV server
   (valkey-server on loopback, tools/harness/valkey_server.py) restores
   ``--blocks`` blocks (125: a 4,000-token prefix of 32-token blocks) as
   one vLLM job, the way a request's prefix is restored; unsigned
   (``"unsigned": true``) against signed with the tier's MAC (keyed
   BLAKE3), and signed with each other candidate put in its place, in
   turns over ``--rounds``
   rounds; per block, the median of the rounds. What a restore costs
   beyond this (the copy into L1, the prefill of the tail) is not here:
   the ratio is the tier's own, the upper bound of what a request sees.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import blake3
import crc32c
import numpy as np

from tools.benchmark.checksum_speed import (
    GIL_PROBE_CALLS,
    calls_before_other_thread_ran,
    page_aligned_random,
)
from tools.benchmark.lib.floors import best_of
from vllm_uma.plugin.block_size import DEFAULT_BLOCK_TOKENS

# A block of the default model (23,040 B of KV a token) and of Qwen3-0.6B
# (114,688 B) at the block size vllm-uma serves (32 tokens: 737,280 and
# 3,670,016 B).
DEFAULT_BLOCKS = (DEFAULT_BLOCK_TOKENS * 23_040, DEFAULT_BLOCK_TOKENS * 114_688)
PREFIX_TOKENS = 4000  # the restore's: 125 blocks of 32 tokens
KEY = os.urandom(32)
SECRET = os.urandom(32).hex()


def _hmac_sha256(key: bytes, header, payload) -> bytes:
    mac = hmac.new(key, header, "sha256")
    mac.update(payload)
    return mac.digest()


def _blake2b(key: bytes, header, payload) -> bytes:
    mac = hashlib.blake2b(header, key=key, digest_size=32)
    mac.update(payload)
    return mac.digest()


def _blake3(key: bytes, header, payload) -> bytes:
    mac = blake3.blake3(header, key=key)
    mac.update(payload)
    return mac.digest()


def candidates() -> dict[str, Callable[[bytes, object, object], bytes]]:
    """Each MAC as block_mac._tag calls it: a key, the header's bytes, the payload."""
    return {"HMAC-SHA256": _hmac_sha256, "keyed BLAKE2b": _blake2b, "keyed BLAKE3": _blake3}


def part_one(sizes: list[int], repeats: int) -> None:
    header = bytes(4096)
    print(f"{'MAC':16} {'block B':>10} {'us/block':>9} {'GB/s':>6}  GIL: calls")
    for size in sizes:
        block = page_aligned_random(size)
        rows: dict[str, Callable[[object], object]] = {"crc32c (reference)": crc32c.crc32c}
        for name, fn in candidates().items():
            rows[name] = lambda data, fn=fn: fn(KEY, header, data)
        for name, fn in rows.items():
            seconds = best_of(repeats, lambda fn=fn, block=block: fn(block))
            calls = calls_before_other_thread_ran(fn, block, 3)
            gil = "held" if calls == GIL_PROBE_CALLS else "released"
            print(
                f"{name:20} {size:>10,} {seconds * 1e6:9.0f} {size / seconds / 1e9:6.2f}"
                f"  {calls:3} {gil}"
            )


def _restore_seconds(tier, jobs, rows: int) -> float:
    """One job restoring every block (what a request's prefix is), timed
    from its submission to its result."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    job_id = next(jobs)
    keys = [i.to_bytes(32, "big") + bytes(4) for i in range(rows)]
    job = TransferJob(job_id, keys, np.arange(rows, dtype=np.int64), True, ReqContext("bench"))
    start = time.perf_counter()
    tier.submit_load(job)
    while True:
        for result in tier.get_finished_jobs():
            if not result.success:
                lost = rows - len(result.successful_keys or ())
                raise SystemExit(f"a restore failed: {lost} of {rows} blocks not restored")
            return time.perf_counter() - start
        time.sleep(0.0002)


def _tier(kv_server, view, signing: dict):
    from vllm_uma.kv_offload.network.settings import parse_network_tier
    from vllm_uma.kv_offload.network.tier import NetworkTier

    # The longest timeout: a loaded machine must not turn blocks into misses.
    raw = {"type": "valkey", "url": kv_server.url, "timeout_s": 60, **signing}
    config = parse_network_tier(raw)
    return NetworkTier(SimpleNamespace(), view, "valkey", settings=config, namespace_id=bytes(16))


def part_two(size: int, blocks: int, rounds: int, work: Path) -> None:
    import itertools

    from tools.harness.valkey_server import KvServer
    from vllm_uma.kv_offload import block_mac

    secret = work / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    memory = f"{blocks * (size + 8192) * 2 // (1 << 20) + 64}mb"
    kv_server = KvServer(work, "--maxmemory", memory, "--maxmemory-policy", "allkeys-lru")
    region = mmap.mmap(-1, blocks * size)
    region[:] = page_aligned_random(blocks * size)
    view = memoryview(region).cast("B", (blocks, size))
    jobs = itertools.count(1)
    the_tiers_tag = block_mac._tag
    variants: dict[str, tuple[dict, Callable | None]] = {
        "unsigned": ({"unsigned": True}, None),
        "signed (the tier's MAC)": ({"secret_file": str(secret)}, the_tiers_tag),
    }
    for name, fn in candidates().items():
        if name != block_mac.NAME:  # the tier's own, above
            variants[f"signed, {name}"] = (
                {"secret_file": str(secret)},
                lambda key, header, payload, fn=fn: fn(
                    key,
                    bytes(memoryview(header)[: block_mac.TAG_AT])
                    + bytes(memoryview(header)[block_mac.TAG_END :]),
                    payload,
                ),
            )
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(rounds):
            for name, (signing, tag) in variants.items():
                if tag is not None:
                    # The tool's what-if: another MAC in the tier's place,
                    # for the stores and the restores of this variant only.
                    block_mac._tag = tag
                kv_server.client().flushall()
                tier = _tier(kv_server, view, signing)
                try:
                    _store_all(tier, jobs, blocks)
                    seconds[name].append(_restore_seconds(tier, jobs, blocks))
                finally:
                    tier.shutdown()
                    block_mac._tag = the_tiers_tag
    finally:
        kv_server.stop()
    base = statistics.median(seconds["unsigned"])
    print(f"\nrestore of {blocks} blocks of {size:,} B, one job, median of {rounds} rounds")
    print(f"{'variant':34} {'us/block':>9} {'x unsigned':>10}")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"{name:34} {median / blocks * 1e6:9.0f} {median / base:10.2f}")


def _store_all(tier, jobs, rows: int) -> None:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    keys = [i.to_bytes(32, "big") + bytes(4) for i in range(rows)]
    job = TransferJob(next(jobs), keys, np.arange(rows, dtype=np.int64), False, ReqContext("b"))
    tier.submit_store(job)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for result in tier.get_finished_jobs():
            if not result.success:
                raise SystemExit("a store failed")
            return
        time.sleep(0.001)
    raise SystemExit("the store did not end in 60 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-bytes", type=int, nargs="+", default=list(DEFAULT_BLOCKS))
    parser.add_argument("--blocks", type=int, default=PREFIX_TOKENS // DEFAULT_BLOCK_TOKENS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    part_one(args.block_bytes, args.repeats)
    with tempfile.TemporaryDirectory(prefix="mac-cost-") as work:
        for size in args.block_bytes:
            part_two(size, args.blocks, args.rounds, Path(work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
