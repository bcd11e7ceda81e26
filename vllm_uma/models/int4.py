"""A recipe's 4-bit build: ``vllm-uma prepare-model NAME --int4``.

Decode on a CPU reads every weight once per step, so 4-bit weights read a
quarter of bfloat16's bytes. vLLM CPU runs them as GPTQ checkpoints through
its int4 kernel (``cpu_gemm_wna16``, AVX-512 CPUs only:
commands/preflight_int4.py). No hub is reachable here, so the checkpoint
is made locally from the recipe's own build, by round-to-nearest
(gptq_rtn.py): no calibration data, not a published GPTQ, and named so.

``<cache>/models/NAME-int4-rtn`` is a recipe of its own, derived from
NAME's (:func:`derived`), published by the same protocol (publish.py):

1. locate: NAME is prepared first (built and checked if needed); the GGUF
   it came from is this build's source too, so a new one rebuilds both;
2. build: every linear of the decoder layers (``model.layers.N.*_proj``)
   becomes GPTQ tensors with one group size for all (the largest of 128,
   64, 32 that divides every input size); embeddings, norms, biases and
   lm_head stay as they are; config.json gains ``quantization_config``
   (quantize_config.json beside it, for other loaders); the tokenizer,
   licence and the rest are copied, and NOTICE says what was done;
3. check: transformers answers the recipe's Int4Check from this
   directory's tensors, dequantized (int4_check.py); then, where vLLM CPU
   has its int4 kernel, a real ``vllm-uma serve --dtype bfloat16`` of it
   answers the same. Where it has not (AVX2), that second part cannot run,
   and the progress says so.

Importing this module imports no torch: the CLI imports it to parse.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from vllm_uma.models.publish import MANIFEST_NAME, Manifest, prepare_recipe
from vllm_uma.models.recipe import PrepareError, Progress, Recipe, Source

SUFFIX = "-int4-rtn"
# Bump when the quantizer, the layout or the check changes; the build's
# version is the base recipe's times 100 plus this, so either rebuilds it.
INT4_VERSION = 1
QUANTIZED = re.compile(r"^model\.layers\.\d+\..+_proj\.weight$")
WEIGHTS = "model.safetensors"
NOT_COPIED = ("config.json", "NOTICE", MANIFEST_NAME, "model.safetensors.index.json")


def is_quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and QUANTIZED.match(name) is not None


def build_from(source_dir: Path, out_dir: Path, source_name: str, progress: Progress) -> int:
    """Write the 4-bit GPTQ directory of ``source_dir`` into ``out_dir``;
    the group size it chose."""
    from safetensors.torch import save_file

    from vllm_uma.models import gptq_rtn

    config = json.loads((source_dir / "config.json").read_text())
    if "quantization_config" in config:
        raise PrepareError(
            f"{source_dir} is already quantized ({config['quantization_config']!r}): "
            f"make the 4-bit build from unquantized weights."
        )
    where, shapes = open_weights(source_dir)
    group = gptq_rtn.group_size_for(
        {name: shape for name, shape in shapes.items() if is_quantized(name, shape)}
    )
    progress(f"quantizing {source_dir.name} to 4 bits (round-to-nearest, groups of {group})")
    tensors = {}
    for name, handle in where.items():
        tensor = handle.get_tensor(name)
        if not is_quantized(name, shapes[name]):
            tensors[name] = tensor
            continue
        packed = gptq_rtn.quantize(tensor, group)
        stem = name.removesuffix(".weight")
        for part in gptq_rtn.PARTS:
            tensors[f"{stem}.{part}"] = getattr(packed, part)
    progress(f"writing {WEIGHTS} to {out_dir}")
    save_file(tensors, str(out_dir / WEIGHTS), metadata={"format": "pt"})
    quant = gptq_rtn.quantization_config(group, source_name)
    (out_dir / "config.json").write_text(
        json.dumps({**config, "quantization_config": quant}, indent=2) + "\n"
    )
    (out_dir / "quantize_config.json").write_text(json.dumps(quant, indent=2) + "\n")
    copy_the_rest(source_dir, out_dir)
    write_notice(source_dir, out_dir, source_name, group)
    return group


def open_weights(source_dir: Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """Each tensor's safetensors file (open, read lazily) and shape."""
    from safetensors import safe_open

    files = sorted(source_dir.glob("*.safetensors"))
    if not files:
        raise PrepareError(f"{source_dir} has no .safetensors weights to quantize.")
    handles = [safe_open(path, framework="pt") for path in files]
    where = {name: handle for handle in handles for name in handle.keys()}
    shapes = {name: tuple(handle.get_slice(name).get_shape()) for name, handle in where.items()}
    return where, shapes


def copy_the_rest(source_dir: Path, out_dir: Path) -> None:
    """Tokenizer, chat template, generation config, licence: every file
    but the weights and what this build writes itself."""
    for path in sorted(source_dir.iterdir()):
        if path.is_file() and path.suffix != ".safetensors" and path.name not in NOT_COPIED:
            shutil.copyfile(path, out_dir / path.name)


def write_notice(source_dir: Path, out_dir: Path, source_name: str, group: int) -> None:
    """The source's NOTICE (if any) and what was changed: a licence such as
    Apache-2.0 asks that changed files say so."""
    before = source_dir / "NOTICE"
    head = before.read_text() + "\n" if before.is_file() else ""
    (out_dir / "NOTICE").write_text(
        f"""{head}4-bit build ({source_name}{SUFFIX}, vllm-uma int4 version {INT4_VERSION})

Made locally by vllm-uma from {source_name}'s weights by round-to-nearest:
each linear weight of the decoder layers became 4 bits per weight, one
fp16 scale per group of {group} inputs (symmetric, GPTQ's checkpoint layout,
quant_method "gptq"). No calibration data was used: this is not a published
GPTQ checkpoint, and its answers may differ from those of the weights it was
made from. Embeddings, norms and the output head are unchanged.
"""
    )


def check(int4_check, name: str, directory: Path, progress: Progress) -> None:
    from vllm_uma.models import int4_check as checks

    checks.in_transformers(int4_check, directory, progress)
    checks.served(int4_check, name, directory, progress)


def derived(base: Recipe, cache_root: Path, progress: Progress) -> Recipe:
    """The 4-bit build of ``base`` as a recipe the publish protocol runs."""
    if base.int4 is None:
        raise PrepareError(
            f"{base.name} has no 4-bit build: no check of its answers in 4 bits is "
            f"recorded (Recipe.int4). Serve it unquantized, or add one (docs/models.md)."
        )
    name = base.name + SUFFIX
    base_dir = cache_root / "models" / base.name

    def locate() -> Source:
        prepare_recipe(base, cache_root, progress)
        manifest = Manifest.read(base_dir / MANIFEST_NAME)
        if manifest is None:
            raise PrepareError(f"{base_dir} has no manifest after it was prepared.")
        return Source(base_dir, manifest.source_sha256)

    def build(source: Source, out_dir: Path, progress: Progress) -> None:
        build_from(source.path, out_dir, base.name, progress)

    return Recipe(
        name=name,
        version=base.version * 100 + INT4_VERSION,
        summary=f"{base.name} in 4 bits (GPTQ layout, round-to-nearest, made locally)",
        locate=locate,
        build=build,
        check=lambda directory, progress: check(base.int4, name, directory, progress),
        dtype="int4 (gptq, round-to-nearest)",
    )
