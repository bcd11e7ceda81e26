"""What the peer comparison sends, and one server's session of it.

Prompts are token ids, drawn at random from the model's vocabulary and sent
as the ``prompt`` of ``/v1/completions`` (both llama-server and vLLM take a
list of ids and use it as given: no tokenizer, no BOS added), so every
server computes exactly the same tokens. Ids come from [1000, high): below
1000 sit the special and byte tokens of the tokenizers we serve, and
``high`` is the smallest of the config's vocab_size, the tokenizer's own
vocabulary (a zoo build pairs a large embedding with SmolLM2's 49,152-token
tokenizer, and vLLM refuses ids past its tokenizer) and the first added
token at or above 1000 (Llama 3's and Qwen's special tokens sit at the top).
Prompt ``n`` of a run starts with its own first id, so no two share a prefix.

One session on one fresh server, in this order (every request streamed,
greedy, with max_tokens; a TTFT request asks for one token, so a first
token whose text is an incomplete UTF-8 character, which llama.cpp holds
back, still closes the stream at once):

    warm-up     one 16-token prompt, 4 tokens (not measured)
    per length  cold: a new prompt; again: the same at once; four other
                prompts of that length; revisit: the first again
    chats       four conversations, interleaved turn by turn (A1 B1 C1 D1
                A2 B2 ...): each turn's prompt is the previous turn's plus
                a reply and a user message of made-up ids (the same ids on
                every server, so no server's own output steers the rest);
                every turn but the first finds its conversation's earlier
                turns behind three other conversations' traffic, as a
                server of several chat users does
    memory      RSS/PSS after the longest length's cold prompt: every
                server has then computed the same context
    decode      128 tokens (ignore_eos) for 1, then 4 requests at once
    restart     a new process, warm-up, the longest cold prompt again
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.benchmark.peers_client import at_once, complete, decode_rate
from tools.benchmark.peers_servers import memory, start_timed
from vllm_uma.server_process import Server

LOW_ID = 1000
WARMUP_TOKENS = 16
DECODE_PROMPT_TOKENS = 32


@dataclass(frozen=True)
class ChatShape:
    """The multi-turn workload: ``chats`` conversations of ``turns`` turns,
    each starting with ``first`` tokens (a system prompt and a question)
    and growing by ``per_turn`` tokens a turn (a reply and the next one)."""

    chats: int = 4
    turns: int = 4
    first: int = 1000
    per_turn: int = 200

    def longest(self) -> int:
        return self.first + (self.turns - 1) * self.per_turn


def token_id_range(model_dir: Path) -> tuple[int, int]:
    """[low, high) of the ids a prompt may use (see the module's docstring)."""
    config = json.loads((model_dir / "config.json").read_text())
    bounds = [config["vocab_size"]]
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.is_file():
        data = json.loads(tokenizer.read_text())
        bounds.append(len(data.get("model", {}).get("vocab") or []) or config["vocab_size"])
        bounds += [t["id"] for t in data.get("added_tokens", []) if t["id"] >= LOW_ID]
    high = min(bounds)
    if high - LOW_ID < 1000:
        raise ValueError(f"{model_dir}: only ids {LOW_ID}..{high} to draw prompts from")
    return LOW_ID, high


def prompt_ids(n: int, length: int, id_range: tuple[int, int]) -> list[int]:
    """Prompt ``n`` of a run: its first id its own, the rest seeded by ``n``."""
    low, high = id_range
    rng = random.Random(n)
    return [low + n % (high - low)] + [rng.randrange(low, high) for _ in range(length - 1)]


@dataclass(frozen=True)
class Plan:
    """The prompts of one round, the same for every server."""

    warmup: list[int]
    targets: dict[int, list[int]]  # by length: the prompt that is revisited
    others: dict[int, list[list[int]]]  # by length: the traffic between
    decode: dict[int, list[list[int]]]  # by concurrency: one prompt a request
    # by conversation: its turns' prompts, each the one before it and more
    chats: list[list[list[int]]] = dataclasses.field(default_factory=list)

    @staticmethod
    def make(
        round_: int, lengths, others: int, concurrency, id_range, chat: ChatShape | None = None
    ) -> "Plan":
        counter = iter(range(round_ * 10_000, (round_ + 1) * 10_000))
        one = lambda length: prompt_ids(next(counter), length, id_range)  # noqa: E731
        plan = Plan(
            warmup=one(WARMUP_TOKENS),
            targets={n: one(n) for n in lengths},
            others={n: [one(n) for _ in range(others)] for n in lengths},
            decode={c: [one(DECODE_PROMPT_TOKENS) for _ in range(c)] for c in concurrency},
        )
        for _ in range(chat.chats if chat else 0):
            turns = [one(chat.first)]
            for _ in range(chat.turns - 1):
                turns.append(turns[-1] + one(chat.per_turn))
            plan.chats.append(turns)
        return plan


def session(make: Callable[[], Server], name: str, plan: Plan, decode_tokens: int) -> dict:
    """One server's figures for one round: two starts (the second after a
    stop: the restart), every figure in the module's docstring, and each
    request's record. The server is stopped however the session ends."""
    out: dict = {
        "start_s": [],
        "ttft_s": {},
        "chat_ttft_s": {},  # by turn (1, 2, ...): one TTFT per conversation
        "restart_ttft_s": {},
        "decode_tok_s": {},
        "memory": {},
        "requests": [],
    }
    longest = max(plan.targets)

    def ask(server: Server, label: str, ids: list[int], max_tokens: int = 1) -> float:
        reply = complete(server.url, name, ids, max_tokens)
        out["requests"].append(reply.record(label, len(ids)))
        return reply.ttft_s

    server, took = start_timed(make)
    try:
        out["start_s"].append(round(took, 3))
        out["memory"]["ready"] = memory(server)
        ask(server, "warm-up", plan.warmup, 4)
        for length, target in plan.targets.items():
            figures = out["ttft_s"][length] = {"cold": ask(server, f"cold-{length}", target)}
            if length == longest:
                out["memory"][f"after_{length}"] = memory(server)
            figures["again"] = ask(server, f"again-{length}", target)
            for k, other in enumerate(plan.others[length]):
                ask(server, f"other-{length}-{k}", other)
            figures["revisit"] = ask(server, f"revisit-{length}", target)
        for turn in range(len(plan.chats[0]) if plan.chats else 0):
            out["chat_ttft_s"][turn + 1] = [
                ask(server, f"chat-{c}-turn-{turn + 1}", turns[turn])
                for c, turns in enumerate(plan.chats)
            ]
        for concurrency, prompts in plan.decode.items():
            replies = at_once(server.url, name, prompts, decode_tokens)
            out["requests"] += [
                r.record(f"decode-c{concurrency}", len(p))
                for r, p in zip(replies, prompts, strict=True)
            ]
            out["decode_tok_s"][concurrency] = decode_rate(replies)
        out["memory"]["end"] = memory(server)
    finally:
        server.stop()
    server, took = start_timed(make)
    try:
        out["start_s"].append(round(took, 3))
        ask(server, "warm-up", plan.warmup, 4)
        out["restart_ttft_s"][longest] = ask(server, f"restart-{longest}", plan.targets[longest])
    finally:
        server.stop()
    return out
