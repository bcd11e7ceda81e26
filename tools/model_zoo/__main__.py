"""``python -m tools.model_zoo``: build or list the zoo's checkpoints.

    python -m tools.model_zoo list
    python -m tools.model_zoo build zoo-qwen3-scaled [--dtype bfloat16]
    python -m tools.model_zoo build --all-scaled

Prints each build's directory on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import sys

from tools.model_zoo import build
from tools.model_zoo.families import FAMILIES, build_name, kv_bytes_per_token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.model_zoo")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every build, with its KV bytes per token")
    make = sub.add_parser("build", help="build (if missing or stale) and print the directory")
    make.add_argument("names", nargs="*")
    make.add_argument("--all-scaled", action="store_true")
    make.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    if args.command == "list":
        print(f"{'build':<26} {'published as':<24} {'layers':>6} {'KV B/token bf16':>16}  fits")
        for family in FAMILIES.values():
            for size in ("scaled", "real"):
                config = family.config(size)
                fits = "yes" if size == "scaled" or family.real_fits else "no"
                print(
                    f"{build_name(family, size):<26} {family.real_name:<24} "
                    f"{config['num_hidden_layers']:>6} {kv_bytes_per_token(config, 2):>16,}  {fits}"
                )
        return 0
    names = list(args.names) + (build.all_builds("scaled") if args.all_scaled else [])
    if not names:
        parser.error("name a build, or give --all-scaled")
    for name in names:
        try:
            print(build.build(name, args.dtype), flush=True)
        except ValueError as exc:
            print(f"python -m tools.model_zoo: error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
