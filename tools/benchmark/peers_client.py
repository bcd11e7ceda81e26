"""The client side of the peer comparison: one streamed completion of token
ids, from llama-server or vLLM, into the same Reply; a batch at once; the
decode rate of a batch.

Both servers stream OpenAI's server-sent events; the figures a reply
carries differ: vLLM puts the prompt's cached tokens in
``usage.prompt_tokens_details`` (with --enable-prompt-tokens-details),
llama.cpp in its last chunk's ``timings.cache_n``. A Reply keeps
perf_counter instants, not durations, so a batch's replies can be laid on
one clock (decode_rate).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

from tools.benchmark.lib.client import chunks
from vllm_uma.server_process import REQUEST_TIMEOUT_S


@dataclass(frozen=True)
class Reply:
    sent: float  # perf_counter when the request left
    first: float | None  # ... when the first chunk with a choice came
    end: float  # ... when the stream closed
    prompt_tokens: int | None
    cached_tokens: int | None  # vLLM's prompt_tokens_details, llama.cpp's timings.cache_n
    completion_tokens: int | None

    @property
    def ttft_s(self) -> float:
        return (self.first or self.end) - self.sent

    def record(self, name: str, sent_tokens: int) -> dict:
        return {
            "name": name,
            "sent_tokens": sent_tokens,
            "ttft_s": round(self.ttft_s, 4),
            "latency_s": round(self.end - self.sent, 4),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }


def read_reply(lines, sent: float) -> Reply:
    """A completions stream, from either server, into a Reply."""
    first, usage, timings = None, {}, {}
    for chunk in chunks(lines):
        if chunk.get("choices") and first is None:
            first = time.perf_counter()
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", timings.get("cache_n"))
    return Reply(
        sent,
        first,
        time.perf_counter(),
        usage.get("prompt_tokens"),
        cached,
        usage.get("completion_tokens", timings.get("predicted_n")),
    )


def complete(url: str, model: str, ids: list[int], max_tokens: int, ignore_eos=False) -> Reply:
    payload = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"ignore_eos": True} if ignore_eos else {}),
    }
    sent = time.perf_counter()
    with requests.post(
        f"{url}/v1/completions", json=payload, stream=True, timeout=REQUEST_TIMEOUT_S
    ) as response:
        response.raise_for_status()
        return read_reply(response.iter_lines(), sent)


def decode_rate(replies: list[Reply]) -> float | None:
    """Tokens a second over a batch: every token after each request's
    first, over the time from the first first-token to the last end.
    Prefill is left out; a server that serves the batch one request after
    another (llama.cpp with one slot) is charged for the wait."""
    tokens = sum((r.completion_tokens or 0) - 1 for r in replies)
    firsts = [r.first for r in replies if r.first is not None]
    if tokens <= 0 or not firsts:
        return None
    return tokens / (max(r.end for r in replies) - min(firsts))


def at_once(url: str, model: str, prompts: list[list[int]], max_tokens: int) -> list[Reply]:
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda p: complete(url, model, p, max_tokens, True), prompts))
