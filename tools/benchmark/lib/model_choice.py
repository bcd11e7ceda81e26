"""``--model`` of the benchmarks: the default model, a model zoo build, or a directory.

A benchmark sizes its L1, pool and prompts in KV bytes from the chosen
model's config.json (geometry.py), in blocks of the size its servers'
flags give (servers.block_tokens), then checks both against the started
server's own breakdown line, so that a workload is never sized for one
model or block size and run on another's KV.

- no ``--model``: the default model (SmolLM2-135M-Instruct), bfloat16;
- ``zoo-...``: a model zoo build (tools/model_zoo), built in bfloat16 if
  missing; its figures are of synthetic weights, and the report says so;
- a recipe's name (vllm-uma prepare-model's), or ``NAME-int4-rtn`` for its
  4-bit build: prepared if missing;
- anything else: a Hugging Face directory, served by path.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tools.benchmark.lib import geometry, prompts


@dataclass(frozen=True)
class ModelChoice:
    served_name: str  # what requests name
    serve_args: list[str]  # what `vllm-uma serve` is given for it
    directory: Path
    synthetic: bool  # a model zoo build: synthetic weights

    def kv_bytes_per_token(self, dtype: str = "bfloat16") -> int:
        return geometry.kv_bytes_per_token(self.directory, dtype)

    def describe(self, dtype: str = "bfloat16") -> str:
        weights = "synthetic weights" if self.synthetic else "real weights"
        per_token = self.kv_bytes_per_token(dtype)
        return f"{self.served_name} ({weights}, {per_token:,} B of KV per token in {dtype})"


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="the default model (unset), a model zoo build (zoo-qwen3-real, ...: "
        "python -m tools.model_zoo list) or a model directory",
    )


def choose(model: str | None) -> ModelChoice:
    if model is None:
        from vllm_uma import models

        return ModelChoice(prompts.MODEL, [], models.prepare(), synthetic=False)
    if model.startswith("zoo-"):
        from tools.model_zoo import build

        directory = build.build(model, dtype="bfloat16")
        return ModelChoice(model, [str(directory), "--served-model-name", model], directory, True)
    built = _recipe_directory(model)
    if built is not None:
        return ModelChoice(model, [str(built), "--served-model-name", model], built, False)
    directory = Path(model).expanduser()
    if not (directory / "config.json").is_file():
        raise SystemExit(f"--model {model}: no config.json in that directory")
    name = directory.name
    return ModelChoice(name, [str(directory), "--served-model-name", name], directory, False)


def _recipe_directory(model: str) -> Path | None:
    """A recipe's build, or its 4-bit build (NAME-int4-rtn), made if missing;
    None when ``model`` names neither."""
    from vllm_uma import models
    from vllm_uma.models.int4 import SUFFIX

    if models.is_recipe(model):
        return models.prepare(model)
    if model.endswith(SUFFIX) and models.is_recipe(model[: -len(SUFFIX)]):
        return models.prepare_int4(model[: -len(SUFFIX)])
    return None


def served_model(ap: argparse.ArgumentParser, model: str) -> str:
    """What the offloading benchmarks serve for ``--model``: a recipe by its
    name, or a model zoo build (synthetic weights) by its directory, which
    vLLM then reports as the model's name; anything else is a usage error."""
    from vllm_uma import models

    if model.startswith("zoo-"):
        try:
            return str(choose(model).directory)
        except ValueError as exc:
            ap.error(f"--model: {exc}")
    if not models.is_recipe(model):
        ap.error(
            f"--model {model!r}: choose a recipe ({', '.join(models.RECIPES)}) or a "
            f"model zoo build (python -m tools.model_zoo list)"
        )
    return model


def check_breakdown(
    choice: ModelChoice, breakdown: dict[str, int], block_tokens: int, dtype: str = "bfloat16"
):
    """Fail unless the server runs the ``block_tokens``-token blocks the
    benchmark gave it (servers.block_tokens of its flags) and its KV bytes
    per block are what the workload was sized for."""
    served = breakdown.get("block_size", 0)  # 0: a line without it (older servers)
    if served and served != block_tokens:
        raise SystemExit(
            f"{choice.served_name}: the server runs {served}-token KV blocks, the benchmark "
            f"sized its workload for {block_tokens} (the block size its flags give: "
            f"--block-size, else vllm-uma's default): a kernel of this model may require its "
            f"own; pass --block-size {served} in the server's flags"
        )
    assumed = geometry.kv_row_bytes(choice.directory, dtype, block_tokens=block_tokens)
    found = breakdown["per_block_bytes"]
    if found != assumed:
        raise SystemExit(
            f"{choice.served_name}: the server reports {found:,} KV bytes per block, the "
            f"benchmark sized its workload for {assumed:,} ({block_tokens}-token blocks): "
            f"the model's config.json and vLLM's KV spec disagree; size from the breakdown "
            f"line instead"
        )
