"""transformers' greedy decoding of a model directory: the reference that
tests and tools compare a served answer against (vllm_uma/models/oracles.py
says how the comparison is judged).

Runs in the test or tool process; imports torch and transformers lazily so
that importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vllm_uma.models.oracles import Verdict, exact, until_near_tie


class TransformersReference:
    """transformers' greedy decoding of a model directory, with its logits."""

    def __init__(self, model_dir: Path | str, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.dtype = dtype
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype)
        ).eval()
        # Several servers are judged against one reference on the same
        # prompts (tests/e2e/test_serve.py): its answer is computed once.
        self._greedy: dict[tuple[tuple[int, ...], int], tuple[list[int], list]] = {}

    def greedy(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], list]:
        """The greedy continuation and, per step, the logits (a float32 tensor each)."""
        key = (tuple(prompt_ids), max_tokens)
        if key not in self._greedy:
            self._greedy[key] = self._generate(prompt_ids, max_tokens)
        tokens, logits = self._greedy[key]
        return list(tokens), list(logits)

    def _generate(self, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], list]:
        import torch

        ids = torch.tensor([list(prompt_ids)])
        eos = self.tokenizer.eos_token_id
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0][len(prompt_ids) :].tolist()
        return tokens, [step[0].float() for step in out.logits]

    def judge(self, prompt_ids: Sequence[int], served: Sequence[int], max_tokens: int) -> Verdict:
        """Served greedy tokens against this reference: exact in float32,
        up to the first near-tie in bfloat16."""
        tokens, logits = self.greedy(prompt_ids, max_tokens)
        if self.dtype == "float32":
            return exact(tokens, served, "float32 vs transformers")
        return until_near_tie(tokens, served, logits)
