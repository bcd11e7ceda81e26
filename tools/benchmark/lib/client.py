"""The benchmarks' HTTP client: streamed completions with their time to first
token, and /metrics read into the counts a benchmark diffs. Non-streamed
requests go through Server.post (vllm_uma/server_process.py).

A stream is vLLM's server-sent events: one ``data: {json}`` line a chunk, a
chunk with ``choices`` carries text, the last (with ``stream_options:
include_usage``) the usage, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import requests

from tools.harness.server import metric

HIT_SOURCES = ("device", "host", "disk")  # L1, the host pool, the disk tier
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"


@dataclass(frozen=True)
class Streamed:
    ttft_s: float | None  # request sent -> first chunk with a choice; None: no token came
    latency_s: float  # request sent -> stream closed
    text: str
    usage: dict | None  # the last usage chunk's; None unless the payload asked for it


def chunks(lines: Iterable[bytes]) -> Iterator[dict]:
    """The JSON chunks of a completions stream; blank lines, comments and
    the closing ``[DONE]`` skipped."""
    for line in lines:
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


def read_stream(lines: Iterable[bytes], start: float) -> Streamed:
    """A stream's chunks, timed from ``start`` (time.perf_counter)."""
    ttft, parts, usage = None, [], None
    for chunk in chunks(lines):
        if chunk.get("choices"):
            if ttft is None:
                ttft = time.perf_counter() - start
            parts.append(chunk["choices"][0].get("text", ""))
        usage = chunk.get("usage") or usage
    return Streamed(ttft, time.perf_counter() - start, "".join(parts), usage)


def stream(url: str, payload: dict, timeout: float) -> Streamed:
    """POST ``payload`` to ``url``/v1/completions with ``stream: true``."""
    start = time.perf_counter()
    with requests.post(
        f"{url}/v1/completions", json={**payload, "stream": True}, stream=True, timeout=timeout
    ) as response:
        response.raise_for_status()
        return read_stream(response.iter_lines(), start)


def metrics(url: str, timeout: float = 30) -> str:
    """The body of ``url``/metrics (Prometheus text)."""
    return requests.get(f"{url}/metrics", timeout=timeout).text


def cached_by_source(body: str) -> dict[str, float]:
    """Prompt tokens found cached, by the tier that supplied them."""
    return {s: metric(body, CACHED_BY_SOURCE, f'source="{s}"') for s in HIT_SOURCES}


def wait_healthy(url: str, timeout: float, interval: float = 1.0) -> None:
    """Until ``url``/health answers 200; RuntimeError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}/health did not answer within {timeout:.0f} s")
        time.sleep(interval)
