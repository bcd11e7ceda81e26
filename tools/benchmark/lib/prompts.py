"""The prompts the benchmarks send: the default model's name and the text.

Every prompt is a pure function of a seed, so that two runs (and two
variants of one run) send the same bytes.
"""

from __future__ import annotations

import random

from vllm_uma import models

MODEL = models.DEFAULT_MODEL_NAME
# Each one token for the default model's tokenizer; text() uses the first
# eight, document() all ten.
WORDS = ["apple", "river", "stone", "cloud", "green", "light", "table", "music", "paper", "glass"]


def text(seed: int, tokens: int) -> str:
    """About ``tokens`` tokens of plain words (one token each for this
    tokenizer), led by the seed so that two seeds differ from the first
    block on (prefix caching hashes chain from the first block)."""
    return f"{seed} " + " ".join(WORDS[(seed * 7 + k) % 8] for k in range(tokens - 2))


def document(seed: int, tokens: int) -> str:
    """About ``tokens`` tokens of a numbered document (a word and a number a
    pair): the fleet benchmark's system prompts and other traffic."""
    return f"Document {seed}: " + " ".join(
        WORDS[(seed * 7 + k * 3) % len(WORDS)] + str(k % 97) for k in range(tokens // 2)
    )


def prompt_ids(i: int, length: int) -> list[int]:
    """Prompt ``i`` as token ids (the completions API takes them, so a count
    is exact without a tokenizer): seeded by its index, different from every
    other from its first token, so no two share a prefix."""
    rng = random.Random(i)
    return [1000 + i % 40000] + [rng.randrange(1000, 49000) for _ in range(length - 1)]
