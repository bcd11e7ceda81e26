"""The publish protocol every recipe's build goes through.

Process: runs in the ``vllm-uma`` command's own process (or a test's, or a
tool's), before any server of the model starts.

On-disk layout under the cache root (``--cache-dir``, ``$VLLM_UMA_CACHE_DIR``,
or ``$XDG_CACHE_HOME/vllm-uma``, default ``~/.cache/vllm-uma``)::

    models/
      .prepare.lock                 flock: one build at a time, any recipe
      .NAME.partial-XXXX/           a build in progress (never served)
      NAME/                         published, complete
        .vllm-uma-complete          manifest, written last

Invariant: a directory is served only if it sits at its final name *and*
carries a manifest of the recipe's current version built from the source
installed now. A build happens in a ``.partial-`` directory, is checked
there, and is published by one ``rename`` after every file (manifest last)
has been fsynced, so an interrupted build leaves only a ``.partial-``
directory, which the next build deletes.

One lock for every recipe: each check starts a real server, and two at once
on a small machine would fight over its cores and memory.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.models.recipe import PrepareError, Progress, Recipe

MANIFEST_NAME = ".vllm-uma-complete"
PARTIAL_MARK = ".partial-"
LOCK_NAME = ".prepare.lock"


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


def model_dir(name: str, cache_root: Path) -> Path:
    return cache_root / "models" / name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_complete(directory: Path, version: int, source_sha256: str | None = None) -> bool:
    """True if ``directory`` is a published build of recipe ``version``.

    ``source_sha256`` (when known) must match the GGUF the build came from,
    so upgrading the source package rebuilds the model.
    """
    manifest = Manifest.read(directory / MANIFEST_NAME)
    if manifest is None or manifest.recipe_version != version:
        return False
    return source_sha256 is None or manifest.source_sha256 == source_sha256


def stderr_progress(message: str) -> None:
    print(f"[vllm-uma prepare-model] {message}", file=sys.stderr, flush=True)


def prepare_recipe(recipe: Recipe, cache_root: Path, progress: Progress = stderr_progress) -> Path:
    """Build ``recipe`` if needed and return its published directory.

    Idempotent: a complete build of the recipe's current version, from the
    source installed now, is returned at once.
    """
    final = model_dir(recipe.name, cache_root)
    try:
        source = recipe.locate()
    except PrepareError:
        # Without the source package a finished build is still good to serve.
        if is_complete(final, recipe.version):
            return final
        raise
    if is_complete(final, recipe.version, source.sha256):
        return final

    models_root = final.parent
    try:
        models_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrepareError(
            f"cannot create the model cache {models_root}: {exc.strerror}. "
            f"Set VLLM_UMA_CACHE_DIR (or --cache-dir) to a writable directory."
        ) from None
    with _exclusive_lock(models_root / LOCK_NAME):
        # Another process may have finished the build while we waited.
        if is_complete(final, recipe.version, source.sha256):
            return final
        _remove_stale_partials(models_root, recipe.name)
        started = time.monotonic()
        partial = Path(tempfile.mkdtemp(prefix=f".{recipe.name}{PARTIAL_MARK}", dir=models_root))
        try:
            progress(f"[1/3] building {recipe.name} from {source.path}")
            recipe.build(source, partial, progress)
            progress("[2/3] verifying")
            recipe.check(partial, progress)
            progress("[3/3] publishing")
            _publish_partial(partial, final, Manifest(recipe.version, source.sha256, recipe.dtype))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        progress(f"done in {time.monotonic() - started:.0f} s")
    return final


def _publish_partial(partial: Path, final: Path, manifest: Manifest) -> None:
    (partial / MANIFEST_NAME).write_text(manifest.to_json())
    _fsync_tree(partial)
    os.chmod(partial, 0o755)  # mkdtemp made it 0o700
    if final.exists():
        # An older recipe or a foreign directory: replace it whole.
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync_dir(final.parent)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale_partials(models_root: Path, name: str) -> None:
    # Called under the lock: no other builder is running, so every partial
    # directory is left over from an interrupted run.
    for entry in models_root.glob(f".{name}{PARTIAL_MARK}*"):
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
