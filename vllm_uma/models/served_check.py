"""Check a model through the real server path before it is published.

``vllm-uma prepare-model`` used to check only transformers' answer; vLLM's
CPU kernels compute differently (oneDNN, its attention ISA, eager or
compiled), and a bfloat16 near-tie answered right in transformers and wrong
in the server. So a new build is also served: a ``vllm-uma serve`` process
on the unpublished directory, with the flags a user's ``vllm-uma serve``
would get, asked the README's question over HTTP with a bounded
``max_tokens``. The answer must mention the expected word and end by itself
(``finish_reason == "stop"``): a runaway generation is a failed check.

A base model has no chat template: its recipe asks for a completion
instead and compares token ids (:func:`served_completion`, gemma3.py).

Runs in the ``vllm-uma prepare-model`` process; the server is a child
process in its own session, stopped (with its engine) whatever happens.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_TOKENS = 32
READY_TIMEOUT_S = 600  # a compiled start on a slow machine


class ServedCheckError(RuntimeError):
    """The server did not start, or answered wrong."""


@contextlib.contextmanager
def serving(model_dir: Path, served_name: str, extra_args: Sequence[str] = ()) -> Iterator:
    """A ready ``vllm-uma serve`` of ``model_dir``, stopped on exit."""
    from vllm_uma.server_process import Server

    command = [sys.executable, "-m", "vllm_uma.commands.main"]
    with tempfile.TemporaryDirectory(prefix="vllm-uma-check-") as tmp:
        log = Path(tmp) / "server.log"
        # --max-model-len bounds the KV cache; the checks need under 100 tokens.
        args = [str(model_dir), "--served-model-name", served_name, "--max-model-len", "1024"]
        server = Server(command, [*args, *extra_args], log)
        try:
            try:
                server.wait_ready(timeout=READY_TIMEOUT_S)
            except (RuntimeError, TimeoutError) as exc:
                raise ServedCheckError(f"the server did not start: {exc}") from None
            yield server
        finally:
            server.stop()


def served_answer(
    model_dir: Path, served_name: str, question: str, extra_args: Sequence[str] = ()
) -> tuple[str, str]:
    """The server's greedy answer to ``question`` and its finish reason;
    ``extra_args`` go to ``vllm-uma serve`` (the check itself passes none)."""
    with serving(model_dir, served_name, extra_args) as server:
        reply = server.chat(served_name, question, MAX_TOKENS)
    choice = reply["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


@dataclass(frozen=True)
class Completion:
    prompt_ids: list[int]  # as the server tokenized the prompt
    token_ids: list[int]  # the greedy continuation
    text: str


def served_completion(
    model_dir: Path,
    served_name: str,
    prompt: str,
    max_tokens: int,
    extra_args: Sequence[str] = (),
) -> Completion:
    """The server's greedy completion of ``prompt``, with its token ids
    (vLLM's ``return_token_ids``: ids as computed, not re-tokenized text)."""
    with serving(model_dir, served_name, extra_args) as server:
        reply = server.complete(served_name, prompt, max_tokens, return_token_ids=True)
    choice = reply["choices"][0]
    return Completion(choice["prompt_token_ids"], choice["token_ids"], choice["text"])


def judge_answer(question: str, answer: str, finish: str, expected: str) -> None:
    """Raise :class:`ServedCheckError` unless ``answer`` mentions ``expected``
    and ended by itself."""
    if expected in answer and finish == "stop":
        return
    ended = "ended by itself" if finish == "stop" else f"was cut at {MAX_TOKENS} tokens"
    raise ServedCheckError(
        f"the server answered {answer!r} to {question!r} and {ended}; expected an "
        f"answer that mentions {expected!r} and ends by itself. Nothing was published."
    )


def check_served(
    model_dir: Path,
    served_name: str,
    question: str,
    expected: str,
    progress: Callable[[str], None],
) -> str:
    progress(f"serving the build (vllm-uma serve) and asking {question!r}")
    answer, finish = served_answer(model_dir, served_name, question)
    judge_answer(question, answer, finish, expected)
    progress(f"served answer: {answer.strip()!r}")
    return answer
