"""The correctness oracles: each passes what it should and fails what it should."""

from __future__ import annotations

import pytest

from vllm_uma.models.oracles import BF16_NEAR_TIE, exact, first_difference, until_near_tie


def logits_row(size: int, scores: dict[int, float]) -> list[float]:
    row = [0.0] * size
    for token, score in scores.items():
        row[token] = score
    return row


@pytest.mark.parametrize(
    "a, b, index",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [1, 2], 2),
        ([], [5], 0),
    ],
)
def test_first_difference(a, b, index):
    assert first_difference(a, b) == index


def test_exact_passes_equal_tokens_and_names_the_first_difference():
    assert exact([4, 5, 6], [4, 5, 6])
    verdict = exact([4, 5, 6, 7], [4, 5, 8, 7], "cold vs restore")
    assert not verdict
    assert "cold vs restore: differ at token 2 of 4" in verdict.detail


def test_a_near_tie_ends_the_comparison():
    reference = [1, 2, 3, 4]
    served = [1, 2, 7, 7]  # diverges at step 2, then unrelated
    logits = [logits_row(10, {}) for _ in range(2)] + [logits_row(10, {3: 20.25, 7: 20.0})]
    verdict = until_near_tie(reference, served, logits)
    assert verdict, verdict.detail
    assert "near-tie (0.250 logits)" in verdict.detail


def test_a_clear_preference_is_a_failure():
    reference, served = [1, 2], [1, 9]
    logits = [logits_row(10, {}), logits_row(10, {2: 21.0, 9: 20.0})]
    verdict = until_near_tie(reference, served, logits, tolerance=BF16_NEAR_TIE)
    assert not verdict
    assert "prefers by 1.000 logits" in verdict.detail


def test_stopping_early_is_not_a_near_tie():
    verdict = until_near_tie([1, 2, 3], [1, 2], [logits_row(4, {})] * 3)
    assert not verdict
    assert "stopped early" in verdict.detail
