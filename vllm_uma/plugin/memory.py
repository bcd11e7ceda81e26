"""The memory budget: ``--gpu-memory-utilization`` as a ceiling over RAM.

On a unified-memory machine the weights, the activations, vLLM's KV cache
(L1) and the KV offload pool (L2) all live in one RAM. The budget is
``gpu_memory_utilization x total RAM``; the KV cache gets what the others
leave::

    0                                                    budget      total RAM
    |-- weights --|-- activations --|-- pool --|-- kv_cache --|.. others ..|

It is a ceiling, not a reservation: nothing here checks how much RAM is free
right now (stock vLLM CPU refuses to start unless the whole budget is free at
start-up). The KV cache is allocated lazily (lazy_kv.py), so it becomes
resident only as blocks are written.

Start-up fails only when the budget cannot hold the weights, the activations,
the pool and the KV cache of one request of ``max_model_len`` tokens. The
error shows the breakdown and the smallest utilization that would work.

Pure arithmetic: no torch, no vLLM, so it is tested exhaustively on numbers.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

GiB = 1 << 30
BREAKDOWN_PREFIX = "memory breakdown:"


class MemoryBudgetError(ValueError):
    """The budget cannot hold the model; the message carries the fix."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Every byte figure of the start-up line, as integers."""

    total: int
    budget: int
    weights: int
    activations: int
    kv_cache: int
    kv_offload_pool: int
    wired: int
    per_block_bytes: int
    num_blocks: int
    # Tokens of max_model_len-long requests the KV cache holds at once. With
    # one KV cache group, num_blocks x block_size. With several (a model with
    # sliding-window and full layers), every group draws its blocks from the
    # same num_blocks, so this is vLLM's group-aware capacity, not
    # num_blocks x block_size, which would overstate it by up to the number
    # of groups.
    max_tokens_cached: int
    block_size: int = 0  # tokens per KV block
    # KV cache groups drawing on those blocks: a prefix's KV is one block per
    # group per block_size tokens (sliding groups free theirs past the window).
    kv_groups: int = 1

    def log_line(self, fleet: tuple[int, int] | None = None, lower_tier: str | None = None) -> str:
        """One line a script can parse: ``key=int`` pairs, then human units.
        ``fleet`` (member, size): this server's budget is its share of a
        fleet's (`vllm-uma fleet`), and the line says so. ``lower_tier``:
        the tier below the host pool, which makes the pool its staging
        area (kv_offload/pool_size.py), and the line says that too."""
        values = asdict(self)
        if fleet is not None:
            values.update(fleet_member=fleet[0], fleet_size=fleet[1])
        pairs = " ".join(f"{k}={v}" for k, v in values.items())
        human = ", ".join(
            f"{k} {fmt_gib(getattr(self, k))}"
            for k in (
                "total",
                "budget",
                "weights",
                "activations",
                "kv_cache",
                "kv_offload_pool",
                "wired",
            )
        )
        if self.kv_offload_pool and lower_tier is not None:
            human += f"; the pool stages KV for the {lower_tier} tier"
        if self.kv_groups > 1:
            human += f"; {self.kv_groups} KV cache groups share the blocks"
        if fleet is not None:
            human += f"; fleet member {fleet[0]} of {fleet[1]}: budget and cores are its share"
        return f"{BREAKDOWN_PREFIX} {pairs} ({human})"


def parse_breakdown(line: str) -> dict[str, int]:
    """Inverse of :meth:`MemoryBreakdown.log_line`, for scripts and tests."""
    start = line.index(BREAKDOWN_PREFIX) + len(BREAKDOWN_PREFIX)
    head = line[start:].split("(", 1)[0]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", head)}


def fmt_gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True)
class BudgetInputs:
    total: int  # RAM of the machine, bytes
    utilization: float  # --gpu-memory-utilization
    weights: int
    activations: int  # peak non-weight memory of the worker (runtime + workspace)
    kv_offload_pool: int
    min_kv_cache: int  # KV bytes of one max_model_len request
    max_model_len: int
    # Workers of this machine that split the budget (tensor/pipeline ranks,
    # local data-parallel engines): each sizes its own KV cache from RAM, so
    # each gets an equal share instead of all claiming the whole of it.
    workers: int = 1

    @property
    def budget(self) -> int:
        return int(self.total * self.utilization) // self.workers

    @property
    def needed(self) -> int:
        return self.weights + self.activations + self.kv_offload_pool + self.min_kv_cache


def kv_cache_bytes(inputs: BudgetInputs) -> int:
    """The KV cache (L1) size the budget allows, or a MemoryBudgetError."""
    kv = inputs.budget - inputs.weights - inputs.activations - inputs.kv_offload_pool
    if kv >= inputs.min_kv_cache:
        return kv
    raise MemoryBudgetError(_shortfall_message(inputs, kv))


def _shortfall_message(inputs: BudgetInputs, kv: int) -> str:
    need_util = math.ceil(inputs.needed * inputs.workers / inputs.total * 100) / 100
    share = f", shared by {inputs.workers} workers" if inputs.workers > 1 else ""
    parts = [
        f"--gpu-memory-utilization={inputs.utilization} gives a budget of "
        f"{fmt_gib(inputs.budget)} ({inputs.utilization:.0%} of "
        f"{fmt_gib(inputs.total)} RAM{share}), which cannot hold weights "
        f"{fmt_gib(inputs.weights)} + activations {fmt_gib(inputs.activations)}"
        f" + kv_offload_pool {fmt_gib(inputs.kv_offload_pool)} + the KV cache "
        f"of one {inputs.max_model_len}-token request "
        f"{fmt_gib(inputs.min_kv_cache)}; {fmt_gib(max(kv, 0))} is left for "
        f"the KV cache."
    ]
    fixes = []
    if need_util <= 1.0:
        fixes.append(f"raise --gpu-memory-utilization to at least {need_util:.2f}")
    fixes.append("lower --max-model-len")
    if inputs.kv_offload_pool:
        fixes.append("shrink --kv-offloading-size")
    parts.append(" To fix: " + ", or ".join(fixes) + ".")
    return "".join(parts)
