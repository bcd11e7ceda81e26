"""prepare-model's check through the real server (vllm_uma/models/served_check.py)."""

from __future__ import annotations

import pytest

from tests.e2e.traffic import EAGER
from vllm_uma import models
from vllm_uma.models import smollm2
from vllm_uma.models.served_check import ServedCheckError, judge_answer, served_answer

pytestmark = pytest.mark.slow


def test_the_check_serves_the_build_and_judges_its_answer(default_model_dir):
    # Eager, to start sooner: the check's own compiled default gives this
    # answer too (test_serve.py's compiled server asks the same question).
    question = smollm2.CHECK_PROMPT
    name = models.DEFAULT_MODEL_NAME
    answer, finish = served_answer(default_model_dir, name, question, EAGER)
    assert (answer, finish) == (smollm2.CHECK_ANSWER, "stop")
    judge_answer(question, answer, finish, smollm2.CHECK_EXPECTED)
    # The same real answer fails a check that expects something else.
    with pytest.raises(ServedCheckError, match="expected an answer that mentions 'Berlin'"):
        judge_answer(question, answer, finish, "Berlin")
