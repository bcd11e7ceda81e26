"""The warm reserve: the KV memory the next request gets, resident before it comes.

Why: the lazy KV cache (L1) and the host pool (L2) commit a page when it is
first written, and a first touch is not free. On this project's machines (KVM
guests whose balloon reports free pages to the host) it costs about 12 us per
4 KiB page: a fresh server's disk restore of a 4k-token prefix at
Qwen3-0.6B's KV size spent 1.29 s of its 2.07 s in page faults, in the pool
rows the disk tier reads into and in the L1 blocks the mover copies into
(docs/benchmark.md). A prefill pays the same faults behind seconds of
compute; a restore has nothing to hide them behind.

What: the L1 blocks vLLM's next allocations take (the front of its free
queue, ``L1Blocks.next_free``) and the pool rows the pool manager's next
stores take (``PoolRows.next_rows``), ``warm_kv_tokens`` tokens' worth of
each, are kept resident:

- the scheduler faults them in with ``MADV_POPULATE_WRITE``
  (pages.populate) once as it is built, before the engine core reports
  ready, and its release thread again whenever the engine has no request,
  after traffic used them, if MemAvailable (and the cgroup's headroom)
  leaves room for all of it above the pressure mark and its margin
  (PressureWatch.room): a fill must not bring the pressure pass back;
- the idle pass leaves their pages alone and puts the L1 ones back in front
  of the free queue after it gave other blocks back (releaser.py), so the
  blocks it just emptied are not the next ones taken; where a reserve block
  is not resident, a resident block the pass would have given back is
  emptied and kept in its place;
- the pressure pass gives back everything, the reserve included (its fresh
  pool rows when no request is in), and the reserve is not refilled until
  the pressure episode is over.

Bounds: at most half of L1's blocks and half of the pool's rows, so a small
KV cache stays lazy. The price is that many bytes resident from start-up on,
logged once then. ``warm_kv_tokens`` 0 turns it off. One exception: an
automatic pool that stages for a lower tier (kv_offload/pool_size.py) is
kept resident whole. It is sized from what passes through it at once, so
every row of it is written again and again; a row touched for the first
time costs a fault per page on the store or restore path (the cold-traffic
cost measured at Qwen3-0.6B's size: no_reuse 0.79x of off, 0.99x with the
pool resident, docs/benchmark.md).

Why no lock while faulting: the blocks and rows are chosen under the
scheduler's lock; ``MADV_POPULATE_WRITE`` never changes a byte, so if the
engine hands a block out meanwhile and a forward or a restore writes it, the
two do not race on its data. The worker cannot free the KV cache meanwhile:
the release thread holds the L1 page map (plugin/engine_context.py) for its whole tick.

Process: the engine core (the 'uni' executor); nothing crosses processes.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass

from vllm_uma.memory_release.l1_blocks import L1Blocks
from vllm_uma.memory_release.pages import PAGE, MadviseError, Range, merge, populate
from vllm_uma.memory_release.pool_rows import PoolRows

# Faulted in per call, so that a stop is seen within a fraction of a second.
CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class ReserveSize:
    l1_blocks: int
    pool_rows: int


def reserve_size(
    tokens: int,
    block_tokens: int,
    l1_blocks: int,
    block_bytes: int,
    pool_rows: int = 0,
    row_bytes: int = 0,
    staging_pool: bool = False,
) -> ReserveSize:
    """``tokens`` of KV in L1 blocks and in pool rows, each at most half of
    its tier; with ``staging_pool``, every pool row."""
    if tokens <= 0:
        return ReserveSize(0, 0)
    blocks = min(-(-tokens // block_tokens), l1_blocks // 2)
    rows = 0
    if staging_pool:
        rows = pool_rows
    elif pool_rows and row_bytes:
        wanted = -(-tokens // block_tokens) * block_bytes
        rows = min(-(-wanted // row_bytes), pool_rows // 2)
    return ReserveSize(blocks, rows)


class WarmReserve:
    def __init__(self, l1: L1Blocks, pool: PoolRows | None, size: ReserveSize):
        self.l1 = l1
        self.pool = pool
        self.size = size
        self.failed: str | None = None  # why the kernel refused, once it did

    def bytes(self) -> tuple[int, int]:
        """The reserve's bytes in L1 and in the pool."""
        rows = self.size.pool_rows * self.pool.row_bytes if self.pool is not None else 0
        return self.size.l1_blocks * self.l1.block_bytes, rows

    def l1_blocks(self) -> list[int]:
        """Under the scheduler's lock: the L1 blocks kept warm now."""
        return self.l1.next_free(self.size.l1_blocks)

    def pool_rows(self) -> list[int]:
        """Under the scheduler's lock: the pool rows kept warm now."""
        if self.pool is None:
            return []
        return self.pool.next_rows(self.size.pool_rows)

    def ranges(self) -> list[Range]:
        """Under the scheduler's lock: the reserve's byte ranges, L1 first
        (a prefill or a restore needs L1; only stores and disk restores need
        pool rows)."""
        out = self.l1.ranges(self.l1_blocks())
        if self.pool is not None:
            out += self.pool.ranges(self.pool_rows())
        return out

    def warm(self, ranges: list[Range], stop: threading.Event) -> int:
        """Without the lock: fault in what of ``ranges`` is not resident; the
        bytes that became resident. A refusal by the kernel turns the
        reserve off (``failed`` says why) rather than failing every tick."""
        if self.failed is not None:
            return 0
        made = 0
        for chunk in _chunks(merge(ranges), CHUNK_BYTES):
            if stop.is_set():
                break
            try:
                made += populate(chunk)
            except MadviseError as e:
                self.failed = _why(e)
                break
        return made


def _chunks(ranges: list[Range], limit: int) -> list[list[Range]]:
    """The ranges in groups of about ``limit`` bytes; a range longer than
    that is cut at page boundaries (populate rounds each range inward, so a
    cut inside a page would skip that page)."""
    out: list[list[Range]] = [[]]
    size = 0
    for start, end in ranges:
        while start < end:
            piece = end
            if end - start > limit:
                piece = (start + limit) // PAGE * PAGE
            out[-1].append((start, piece))
            size += piece - start
            start = piece
            if size >= limit:
                out.append([])
                size = 0
    return [group for group in out if group]


def _why(e: MadviseError) -> str:
    if e.errno == errno.EINVAL:
        return "this kernel has no MADV_POPULATE_WRITE (Linux 5.14 or later has)"
    if e.errno in (errno.ENOMEM, errno.EFAULT):
        return f"the kernel could not find the memory ({os.strerror(e.errno)})"
    return str(e)
