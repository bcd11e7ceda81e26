"""The client side of the KV offloading benchmark: a streamed completion's
figures, a pass of them at a fixed concurrency, and the /metrics counters
that say which tier supplied the cached prompt tokens (over lib/client.py).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from tools.benchmark.lib import client
from tools.benchmark.lib.log import progress
from tools.benchmark.lib.prompts import MODEL
from tools.harness.server import metric

REQUEST_TIMEOUT_S = 900
COMPUTED = "vllm:prompt_tokens_by_source_total"
BYTES_MOVED = "vllm:kv_offload_total_bytes_total"
DISK_WRITTEN = "vllm:kv_offload_disk_written_bytes_total"


@dataclass(frozen=True)
class Reply:
    ttft_s: float  # request sent -> first chunk with a token
    latency_s: float  # request sent -> stream closed
    prompt_tokens: int
    completion_tokens: int


def stream_completion(url: str, prompt: str, max_tokens: int, model: str = MODEL) -> Reply:
    """One greedy completion with ``stream: true``; TTFT is the time to the
    first chunk that carries a choice (the first token)."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    reply = client.stream(url, payload, REQUEST_TIMEOUT_S)
    if reply.ttft_s is None or reply.usage is None:
        raise RuntimeError(f"the stream from {url} ended without a token or without usage")
    usage = reply.usage
    return Reply(reply.ttft_s, reply.latency_s, usage["prompt_tokens"], usage["completion_tokens"])


@dataclass(frozen=True)
class PassResult:
    replies: list[Reply]
    wall_s: float

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.replies]

    @property
    def tokens(self) -> int:
        return sum(r.prompt_tokens + r.completion_tokens for r in self.replies)


def run_pass(
    url: str, prompts: list[str], max_tokens: int, concurrency: int, label: str, model: str = MODEL
) -> PassResult:
    """Send ``prompts`` with at most ``concurrency`` in flight; a progress
    line per finished request."""
    start = time.perf_counter()
    replies: list[Reply] = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(stream_completion, url, p, max_tokens, model) for p in prompts]
        for future in as_completed(futures):
            reply = future.result()
            replies.append(reply)
            progress(
                f"  {label} {len(replies)}/{len(prompts)}: TTFT {reply.ttft_s:.2f} s, "
                f"{reply.prompt_tokens} prompt tokens"
            )
    return PassResult(replies, time.perf_counter() - start)


def scrape(url: str) -> dict[str, float]:
    """The counters the benchmark diffs around a measured pass."""
    text = client.metrics(url)
    out = {f"hit_{s}": n for s, n in client.cached_by_source(text).items()}
    out["computed"] = metric(text, COMPUTED, 'source="local_compute"')
    for kind in ("CPU_to_GPU", "GPU_to_CPU"):
        out[f"bytes_{kind}"] = metric(text, BYTES_MOVED, f'transfer_type="{kind}"')
    out["bytes_all"] = metric(text, BYTES_MOVED)
    out["disk_written"] = metric(text, DISK_WRITTEN)
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(after[k] - before[k]) for k in after}


def wait_quiet(url: str, timeout: float = 60) -> None:
    """Wait until no offloading transfer has moved bytes for two seconds, so
    that a measured pass does not share the cores with the warm-up's stores:
    neither L1 <-> pool copies nor the disk tier's writes, which go on after
    the copies into the pool have ended. (A stopping server writes its
    pending disk-tier blocks by itself: the platform raises
    --shutdown-timeout when a disk tier is on.)"""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        counters = scrape(url)
        now = (counters["bytes_all"], counters["disk_written"])
        if now == last:
            return
        last = now
        time.sleep(2)
    progress(f"  transfers still moving after {timeout:.0f} s; stopping anyway")
