"""The served answer check's verdicts (the real server runs in e2e)."""

from __future__ import annotations

import pytest

from vllm_uma.models import served_check
from vllm_uma.models.served_check import ServedCheckError, judge_answer

Q = "What is the capital of France? Answer with one word."


def test_a_right_answer_that_ends_passes(monkeypatch, tmp_path):
    # What check_served makes of the verdict: the answer, and the line saying it.
    answer = " The capital of France is Paris."
    monkeypatch.setattr(served_check, "served_answer", lambda *args: (answer, "stop"))
    said = []
    assert served_check.check_served(tmp_path, "m", Q, "Paris", said.append) == answer
    assert said[-1] == "served answer: 'The capital of France is Paris.'"


def test_a_wrong_answer_is_refused_with_what_was_said():
    with pytest.raises(ServedCheckError, match='answered "L\'Étoile, la Marseillaise"'):
        judge_answer(Q, "L'Étoile, la Marseillaise", "stop", "Paris")


def test_a_runaway_answer_is_refused_even_if_it_mentions_the_word():
    with pytest.raises(ServedCheckError, match="was cut at 32 tokens"):
        judge_answer(Q, "Paris, Paris, Paris, Paris", "length", "Paris")
