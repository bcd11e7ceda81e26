"""The KV offloading benchmark's workloads: its settings, the block geometry
a server reports, and each workload's prompts sized from that geometry.

Pure arithmetic on the flags and the first server's `memory breakdown:`
line (kv_offload_runner.py reads it); runs in the benchmark's process.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from tools.benchmark.lib.prompts import text
from tools.benchmark.lib.report import GiB

WORKLOADS = ("no_reuse", "reuse_fits", "spill_revisit", "restart")
# Seeds per workload: no prompt of one workload shares a block with another's.
SEEDS = {"no_reuse": 1000, "reuse_fits": 2000, "spill_revisit": 4000, "restart": 6000}


@dataclass(frozen=True)
class Settings:
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    requests: int
    suffix_tokens: int
    l1_bytes: int
    pool_gib: float
    spill_factor: float
    max_model_len: int
    equal_memory: bool
    disk_dir: Path
    disk_cap_gib: float
    keep_disk: bool
    model: str  # a recipe's name (vllm_uma.models): served by that name
    server_args: tuple[str, ...]
    # pool_disk at equal memory: the server sizes its pool (the disk tier's
    # staging area, kv_offload/pool_size.py), of staging_bytes, and L1 gets
    # the rest of the budget.
    staging_pool: bool = False
    staging_bytes: int = 0
    # Measured passes per server (restart: always 1). With 4 requests in
    # flight, whether the idle engine's first step takes one request or two
    # is a race of arrival, and it moves a pass's p50 by 0.3 s (0.55 vs
    # 0.82 s, seen in one round of reuse_fits), more than any tier's cost:
    # several passes per server make a round's p50 a figure of the server.
    passes: int = 1

    @classmethod
    def from_args(cls, args) -> "Settings":
        fields = {
            k: getattr(args, k)
            for k in cls.__dataclass_fields__
            if k not in ("server_args", "staging_pool", "staging_bytes", "passes")
        }
        return cls(
            **fields,
            server_args=tuple(shlex.split(args.server_args)),
            staging_pool=args.equal_memory,
            staging_bytes=getattr(args, "staging_bytes", 0),
            passes=getattr(args, "passes", 1),
        )

    @property
    def pool_bytes(self) -> int:
        return int(self.pool_gib * GiB)


@dataclass(frozen=True)
class Sizing:
    """Block geometry read from the first server's `memory breakdown:` line.

    A model with several KV cache groups (sliding-window and full layers)
    stores one block per group for each block_size tokens of a prompt in
    the pool (vLLM's connector stores every group's blocks), so a prompt's
    blocks and bytes count every group. L1 holds more of such prompts than
    that suggests: a sliding group frees its blocks past the window while
    the request runs, and they are evicted first. How many tokens L1 holds
    is the server's own figure (max_tokens_cached: vLLM's group-aware
    capacity; num_blocks x block_size for one group), and a spill set twice
    that size was measured to leave L1 (gemma-3-270m: 12 prompts of 4,000
    tokens sized from the pool rows were all L1 hits).
    """

    block_size: int
    per_block_bytes: int
    l1_blocks: int
    pool_blocks: int
    kv_groups: int = 1
    l1_capacity_tokens: int = 0  # max_tokens_cached; 0: l1_blocks x block_size

    @property
    def kv_per_token(self) -> float:
        return self.per_block_bytes * self.kv_groups / self.block_size

    @property
    def l1_tokens(self) -> int:
        return self.l1_capacity_tokens or self.l1_blocks * self.block_size

    def blocks(self, tokens: int) -> int:
        return self.kv_groups * math.ceil(tokens / self.block_size)


@dataclass(frozen=True)
class Traffic:
    warmup: tuple[str, ...]  # served first on the same server (or the writer), not measured
    measured: tuple[str, ...]
    # Further measured passes on the same server, after `measured`.
    more: tuple[tuple[str, ...], ...] = ()

    @property
    def passes(self) -> tuple[tuple[str, ...], ...]:
        return (self.measured, *self.more)


# Seeds of a workload's passes stay below the next workload's: at most this
# many measured requests of the controls in all passes (checked by the CLI).
MAX_CONTROL_REQUESTS = 800


def build_traffic(name: str, s: Settings, z: Sizing) -> Traffic:
    """A workload's prompts. Each pass of the controls is new traffic of the
    same shape (no_reuse: new prompts; reuse_fits: the same prefixes, new
    suffixes); spill_revisit revisits the same prompts in the same order
    each pass, which LRU has evicted again by then; restart has one pass,
    the fresh server's first traffic."""
    seed, n, t = SEEDS[name], s.requests, s.prompt_tokens
    passes = range(s.passes)
    if name == "no_reuse":
        runs = [tuple(text(seed + p * n + i, t) for i in range(n)) for p in passes]
        return Traffic((), runs[0], tuple(runs[1:]))
    if name == "reuse_fits":
        k = reuse_prefixes(s, z)
        prefixes = [text(seed + i, t - s.suffix_tokens) for i in range(k)]
        warm = tuple(f"{p} {text(seed + 100 + i, s.suffix_tokens)}" for i, p in enumerate(prefixes))
        runs = [
            tuple(
                f"{prefixes[j % k]} {text(seed + 200 + p * n + j, s.suffix_tokens)}"
                for j in range(n)
            )
            for p in passes
        ]
        return Traffic(warm, runs[0], tuple(runs[1:]))
    prompts = tuple(text(seed + i, t) for i in range(spill_prompts(s, z)))
    if name == "restart":
        return Traffic(prompts, prompts)
    return Traffic(prompts, prompts, (prompts,) * (s.passes - 1))


def reuse_prefixes(s: Settings, z: Sizing) -> int:
    """Two prefixes if L1 holds them beside `concurrency` suffixes, else one."""
    in_flight = s.concurrency * (z.blocks(s.suffix_tokens + s.max_tokens) + 1)
    for k in (2, 1):
        if k * z.blocks(s.prompt_tokens) + in_flight <= z.l1_blocks:
            return k
    raise RuntimeError(
        f"reuse_fits: L1 of {z.l1_blocks} blocks cannot hold one {s.prompt_tokens}-token "
        f"prefix beside {s.concurrency} requests in flight: raise --l1-bytes or lower "
        f"--prompt-tokens"
    )


def spill_prompts(s: Settings, z: Sizing) -> int:
    """Enough distinct prompts that each has left L1 before it comes back
    (served in the same order twice, LRU evicts every one), few enough
    that the pool holds all of them."""
    per = z.blocks(s.prompt_tokens)
    least = z.l1_tokens // s.prompt_tokens + 2
    most = int(0.9 * z.pool_blocks) // per
    wanted = max(math.ceil(s.spill_factor * z.l1_tokens / s.prompt_tokens), least)
    if most < least:
        raise RuntimeError(
            f"spill: {least} prompts of {per} blocks overflow L1 ({z.l1_tokens} tokens) but "
            f"the pool holds {z.pool_blocks} blocks: raise --pool-gib or lower --l1-bytes"
        )
    return min(wanted, most)
