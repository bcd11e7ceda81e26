"""The token-exact check of an instruct model, through its chat template.

transformers, in float32, applies the build's chat template to one user
message and answers it greedily; the answer must start as expected (a
broken conversion fails here, in seconds). Then a real ``vllm-uma serve``
of the build, in float32, answers the same message twice:

- ``/v1/completions`` with the templated *text*: the server's tokenizer
  must give transformers' prompt ids, and its greedy ids must be
  transformers';
- ``/v1/chat/completions`` with the message: vLLM renders the template
  itself; again the prompt ids and the greedy ids must be transformers'.

Both ask with ``return_token_ids``, so the ids compared are the ones vLLM
computed, not its text tokenized again. Float32 makes "exactly" fair as
long as no greedy step is a near-tie (oracles.py): transformers' top-two
gap at every step is measured and reported, and a recipe chooses its
question for a wide one. gemma3.py does the same for a base model, whose
prompt has no template.

Runs in ``vllm-uma prepare-model``'s process; the server is a child
(served_check.py), stopped whatever happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.models.oracles import first_difference
from vllm_uma.models.recipe import PrepareError, Progress


@dataclass(frozen=True)
class ChatCheck:
    name: str  # the served model name
    question: str  # one user message
    tokens: int  # greedy tokens compared
    start: str  # the answer's text must start with this
    serve_args: tuple[str, ...]  # for vllm-uma serve: float32, at least


@dataclass(frozen=True)
class Answer:
    prompt_ids: list[int]  # the templated prompt, as tokenized
    token_ids: list[int]  # the greedy answer
    text: str  # the answer's text
    margins: tuple[float, ...] = ()  # transformers' top-two gap per answer token


def reference(check: ChatCheck, directory: Path, progress: Progress) -> tuple[str, Answer]:
    """transformers' float32 greedy answer: (the templated text, answer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"checking the build in transformers (float32): {check.question!r}")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    messages = [{"role": "user", "content": check.question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    templated = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    # /v1/completions tokenizes the text with the tokenizer's special
    # tokens added: that must not change the template's ids (no extra <bos>).
    prompt_ids = list(tokenizer(text)["input_ids"])
    if list(templated) != prompt_ids:
        raise PrepareError(
            f"the build's tokenizer gives the templated {check.question!r} the ids "
            f"{list(templated)} from its chat template and {prompt_ids} from its text: "
            f"a server would not see the prompt the template makes. Nothing was published."
        )
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    out = greedy(model, torch.tensor([prompt_ids]), check.tokens)
    generated = out.sequences[0][len(prompt_ids) :].tolist()
    answer_text = tokenizer.decode(generated, skip_special_tokens=True)
    answer = Answer(prompt_ids, generated, answer_text, top_two_gaps(out.logits))
    if not answer_text.startswith(check.start):
        raise PrepareError(
            f"the converted model answered {check.question!r} with {answer_text!r}, expected "
            f"it to start with {check.start!r}; the conversion is broken with this "
            f"transformers version, nothing was published."
        )
    progress(f"transformers: {answer_text!r} (narrowest margin {min(answer.margins):.2f} logits)")
    return text, answer


def greedy(model, ids, tokens: int):
    """transformers' greedy answer to ``ids`` (one row), with its logits."""
    import torch  # torch loads only when a check runs, as above

    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )


def top_two_gaps(step_logits: Sequence) -> tuple[float, ...]:
    """The gap between the best and second-best logit at each step."""
    gaps = []
    for logits in step_logits:
        best, second = logits[0].float().topk(2).values.tolist()
        gaps.append(best - second)
    return tuple(gaps)


def served(check: ChatCheck, directory: Path, text: str) -> tuple[Answer, Answer]:
    """The server's greedy answers: (to the templated text through
    /v1/completions, to the message through /v1/chat/completions)."""
    import requests

    from vllm_uma.models.served_check import ServedCheckError, serving

    try:
        with serving(directory, check.name, check.serve_args) as server:
            completion = server.complete(check.name, text, check.tokens, return_token_ids=True)
            chat = server.chat(check.name, check.question, check.tokens, return_token_ids=True)
    except (ServedCheckError, requests.RequestException) as exc:
        raise PrepareError(f"{exc} Nothing was published.") from None
    choice = completion["choices"][0]
    first = Answer(choice["prompt_token_ids"], choice["token_ids"], choice["text"])
    choice = chat["choices"][0]
    second = Answer(chat["prompt_token_ids"], choice["token_ids"], choice["message"]["content"])
    return first, second


def compare(check: ChatCheck, want: Answer, got: Answer, endpoint: str) -> None:
    require_same(f"{endpoint}'s prompt token ids", want.prompt_ids, got.prompt_ids, check)
    require_same(f"{endpoint}'s greedy token ids", want.token_ids, got.token_ids, check, want)


def require_same(
    what: str, want: list[int], got: list[int], check: ChatCheck, answer: Answer | None = None
) -> None:
    """Raise :class:`PrepareError` unless the two id lists are equal."""
    i = first_difference(want, got)
    if i is None:
        return
    margin = ""
    if answer is not None and i < len(answer.margins):
        margin = f"; transformers' margin there: {answer.margins[i]:.2f} logits"
    raise PrepareError(
        f"{what} differ at position {i}: transformers {want}, server {got} (float32, "
        f"{check.question!r}{margin}). vLLM reads this build differently from "
        f"transformers, so nothing was published; report it with `vllm-uma --version`."
    )


def run(check: ChatCheck, directory: Path, progress: Progress) -> None:
    """The whole check; raise :class:`PrepareError` on any difference."""
    text, want = reference(check, directory, progress)
    progress(f"serving the build (vllm-uma serve {' '.join(check.serve_args)})")
    completion, chat = served(check, directory, text)
    compare(check, want, completion, "/v1/completions")
    compare(check, want, chat, "/v1/chat/completions")
    progress(f"server: the same {len(want.token_ids)} tokens on both endpoints, {chat.text!r}")
