"""What a recipe is: the one small interface every locally built model has.

A recipe answers three questions, each a plain function, so the publish
protocol (publish.py) treats every model alike and tests swap any of them
for a fake:

- ``locate()``: where is the source installed, and which GGUF is it (its
  sha256, recorded in the manifest so a new source rebuilds the model)?
- ``build(source, out_dir, progress)``: write a Hugging Face directory into
  ``out_dir``, a private ``.partial-`` directory nobody serves;
- ``check(out_dir, progress)``: raise :class:`PrepareError` unless the build
  answers right, in transformers and through the real server.

Importing this module (or a recipe's) imports neither torch nor vLLM: the
heavy work happens inside ``build`` and ``check``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]


class PrepareError(RuntimeError):
    """A model cannot be prepared; the message says what to do."""


@dataclass(frozen=True)
class Source:
    path: Path  # what the build reads: a GGUF file, or the package that assembles one
    sha256: str  # the GGUF the build is made from


@dataclass(frozen=True)
class Int4Check:
    """How a recipe's 4-bit build (int4.py) is checked: one chat question,
    whose greedy answer's first ``tokens`` tokens must start with ``start``.
    Not token for token: the 4-bit weights answer differently, in bfloat16."""

    question: str
    start: str
    tokens: int


@dataclass(frozen=True)
class Recipe:
    name: str  # the directory name under models/ and the served model name
    version: int  # bumped when build or check changes, so older builds are rebuilt
    summary: str  # one line for `--help` and error messages
    locate: Callable[[], Source]
    build: Callable[[Source, Path, Progress], None]
    check: Callable[[Path, Progress], None]
    dtype: str = "bfloat16"  # of the saved weights, recorded in the manifest
    int4: Int4Check | None = None  # None: no 4-bit build (`prepare-model --int4` refuses)
