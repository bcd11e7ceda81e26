"""Which KV bytes a disk tier directory may serve: the namespace of a server.

A block file is named by vLLM's prefix block hash, which depends on the
tokens only. Two servers with the same tokens but a different model, dtype,
KV layout or block size produce different KV bytes under the same name, so
block files live in a directory per namespace, and every file carries the
namespace id (checked on load, so a file copied across is refused).

The namespace covers what makes the bytes differ:
- the server's KV-shaping settings, read once by the API server
  (namespace_inputs.py: revision, download dir, dtypes, quantization,
  hf_overrides, load format, remote code, the vLLM version);
- the model's name, its KV dtype and the KV layout (layer names, tokens per
  block, bytes per block, vLLM's KV cache layout, world size);
- a fingerprint of the weights themselves: replacing a checkpoint under the
  same name changes the KV the model computes. The fingerprint is a BLAKE3
  hash of the weight and config files' contents. Hashing is fast (BLAKE3
  ran at about 8 GB/s on our machines) but a large checkpoint is still
  seconds of reading, so
  the hash is kept in ``fingerprints.json`` under the tier's root, keyed by
  each file's path, size, mtime, ctime and inode: any rewrite of a file
  changes that key and forces a fresh hash.

Computed once, at start-up, in the engine-core process (the spec's
``get_manager``), from vLLM's OffloadingConfig.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from blake3 import blake3

from vllm_uma.kv_offload.disk.layout import read_json_file, write_private_json
from vllm_uma.kv_offload.disk.progress import Progress
from vllm_uma.log import get_logger

logger = get_logger(__name__)

# The files whose contents decide the KV a model computes.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CONFIG_FILES = ("config.json", "generation_config.json")
FINGERPRINTS_FILE = "fingerprints.json"


@dataclass(frozen=True)
class Namespace:
    id: bytes  # 16 bytes, in every block file's header
    info: dict  # what went into it, written beside the blocks for people

    @property
    def hex(self) -> str:
        return self.id.hex()


def namespace_for(offloading_config, fingerprint: str, server: dict | None = None) -> Namespace:
    """``server``: the KV-shaping settings the API server read
    (namespace_inputs.py); every one of them is part of the id."""
    cfg = offloading_config
    info = {
        "server": server or {},
        "model": cfg.model.name,
        "kv_dtype": cfg.model.dtype,
        "weights_blake3": fingerprint,
        "kv_cache_layout": cfg.kv_cache_layout,
        "worker_kv_bytes_per_block": cfg.worker_kv_bytes_per_block,
        "tokens_per_hash": cfg.cache.tokens_per_hash,
        "blocks_per_chunk": cfg.cache.blocks_per_chunk,
        "world_size": cfg.parallel.world_size,
        "groups": [
            {"tokens_per_block": g.tokens_per_block, "layers": list(g.layer_names)}
            for g in cfg.groups
        ],
    }
    digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).digest()
    return Namespace(id=digest[:16], info=info)


def model_files(model_dir: Path) -> list[Path]:
    files = [
        p
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name in CONFIG_FILES)
    ]
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) under {model_dir}")
    return files


def resolve_model_dir(
    model: str, revision: str | None = None, download_dir: str | None = None
) -> Path:
    """The local directory holding ``model``: a path, or the cached snapshot
    of a hub id at ``revision`` (the one vLLM loads, not the default)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    # Imported here: only hub ids need it, and it is heavy.
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                model, revision=revision, cache_dir=download_dir, local_files_only=True
            )
        )
    except Exception as exc:
        raise FileNotFoundError(
            f"the disk tier needs the model's files to fingerprint its weights, "
            f"but {model!r} is neither a directory nor in the local hub cache ({exc})"
        ) from None


def weights_fingerprint(
    model: str, cache_path: Path, revision: str | None = None, download_dir: str | None = None
) -> str:
    """BLAKE3 over the model's weight and config files, cached by file identity."""
    model_dir = resolve_model_dir(model, revision, download_dir)
    cache = _load_cache(cache_path)
    overall = blake3()
    changed = False
    files = [(path, path.stat()) for path in model_files(model_dir)]
    todo = [(p, st) for p, st in files if not _cached(cache, p, st)]
    if todo:
        # Reading a large checkpoint takes a while: say so before it starts.
        logger.info(
            "Disk KV tier: fingerprinting %d model file(s), %.2f GiB, under %s for the "
            "store's namespace (once per checkpoint; cached in %s).",
            len(todo),
            sum(st.st_size for _, st in todo) / 2**30,
            model_dir,
            cache_path,
        )
    progress = Progress("fingerprinting", "GiB", sum(st.st_size for _, st in todo), 2**30)
    for path, st in files:
        if _cached(cache, path, st):
            digest = cache[str(path)][1]
        else:
            digest = _hash_file(path, progress)
            # One entry per path: a rewritten file replaces its stale hash.
            cache[str(path)] = [_identity(st), digest]
            changed = True
        overall.update(f"{path.relative_to(model_dir)}={digest}\n".encode())
    if changed:
        _save_cache(cache_path, cache)
    return overall.hexdigest()


# Hashed in slices so that a checkpoint of one large file reports progress.
_SLICE = 256 << 20


def _hash_file(path: Path, progress: Progress) -> str:
    hasher = blake3(max_threads=blake3.AUTO)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return hasher.hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                for offset in range(0, size, _SLICE):
                    piece = view[offset : offset + _SLICE]
                    hasher.update(piece)
                    progress.advance(len(piece))
                    piece.release()
            finally:
                view.release()
    return hasher.hexdigest()


def _identity(st) -> str:
    return f"{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def _cached(cache: dict, path: Path, st) -> bool:
    entry = cache.get(str(path))
    return isinstance(entry, list) and len(entry) == 2 and entry[0] == _identity(st)


def _load_cache(path: Path) -> dict[str, list]:
    data = read_json_file(path)
    # Missing or damaged: recompute, it is only a cache.
    return data if isinstance(data, dict) else {}


def _save_cache(path: Path, cache: dict[str, list]) -> None:
    # Only a cache: a full or read-only disk costs a rehash at the next
    # start, never this start.
    with contextlib.suppress(OSError):
        write_private_json(path, cache)
