"""``vllm-uma kv-store ROOT COMMAND``: the administrator's view of a disk tier.

    vllm-uma kv-store ROOT ls                 namespaces: model, dtype, blocks, size, last use
    vllm-uma kv-store ROOT du                 bytes per namespace and in all
    vllm-uma kv-store ROOT verify [--remove]  check every block file; remove bad ones
    vllm-uma kv-store ROOT prune [--older-than DAYS] [--namespace ID] [--missing-models] [--dry-run]
    vllm-uma kv-store ROOT clear --yes        delete every block file
    vllm-uma kv-store ROOT pins|unpin|export|import   pins, and a pin carried
                                              to another store (kv_store_pins.py)

Safe while servers use the store (kv_offload/disk/admin.py says why).
Exit status: 0 done; 1 verify found bad files; 2 a usage error, ROOT is
not a store, or a pin command refused (the reason on stderr).

A network tier's KV server (a URL instead of ROOT): kv_store_server.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from vllm_uma.commands import kv_store_pins
from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.pins.book import PinError
from vllm_uma.kv_offload.pins.bundle import BundleError
from vllm_uma.log import human_size

PROG = "vllm-uma kv-store"


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ns / 1e9)) if ns else "-"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog=f"A network tier's KV server: {PROG} URL ls|du|clear (see {PROG} URL --help).",
    )
    parser.add_argument("root", type=Path, help="the fs tier's root_dir")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ls", help="namespaces with model, dtype, blocks, size, last use")
    commands.add_parser("du", help="bytes per namespace and in all")
    verify = commands.add_parser("verify", help="check every block file's header and checksum")
    verify.add_argument("--remove", action="store_true", help="delete the bad files")
    prune = commands.add_parser("prune", help="delete the blocks that match every criterion")
    prune.add_argument("--older-than", type=float, metavar="DAYS", help="last used before")
    prune.add_argument("--namespace", metavar="ID", help="a namespace id from `ls`")
    prune.add_argument(
        "--missing-models", action="store_true", help="namespaces whose model directory is gone"
    )
    prune.add_argument("--dry-run", action="store_true", help="say what would go")
    clear = commands.add_parser("clear", help="delete every block file")
    clear.add_argument("--yes", action="store_true", help="required: this deletes everything")
    kv_store_pins.add_parsers(commands)
    return parser


def _ls(root: Path) -> int:
    rows = admin.survey(root)
    print(f"{'namespace':32}  {'model':40} {'kv dtype':9} {'blocks':>7} {'size':>10}  last use")
    for s in rows:
        dtype = str((s.info or {}).get("kv_dtype", "?"))
        print(
            f"{s.namespace:32}  {s.model[-40:]:40} {dtype:9} {s.blocks:7d} "
            f"{human_size(s.bytes):>10}  {_when(s.last_use_ns)}"
        )
    if not rows:
        print("(no namespaces)")
    return 0


def _du(root: Path) -> int:
    rows = admin.survey(root)
    for s in rows:
        temps = f"  ({s.temp_files} temp files in flight or left over)" if s.temp_files else ""
        print(f"{human_size(s.bytes):>10}  {s.namespace}  {s.model}{temps}")
    print(
        f"{human_size(sum(s.bytes for s in rows)):>10}  total, {sum(s.blocks for s in rows)} blocks"
    )
    return 0


def _verify(root: Path, remove: bool) -> int:
    report = admin.verify(root, remove)
    for path, why in report.bad:
        print(f"bad: {path}: {why}")
    if not report.bad:
        removed = ""
    elif remove:
        removed = f", {report.removed} removed"
    else:
        removed = " (--remove deletes them)"
    print(f"{report.checked} block files checked, {len(report.bad)} bad{removed}")
    return 1 if report.bad else 0


def main(argv: list[str]) -> int:
    from vllm_uma.commands import kv_store_server

    if kv_store_server.is_kv_server_url(argv):
        return kv_store_server.main(argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command in kv_store_pins.COMMANDS:
            return kv_store_pins.run(args)
        if args.command == "ls":
            return _ls(args.root)
        if args.command == "du":
            return _du(args.root)
        if args.command == "verify":
            return _verify(args.root, args.remove)
        if args.command == "prune":
            older = None if args.older_than is None else args.older_than * 86400
            files, nbytes = admin.prune(
                args.root,
                older_than_s=older,
                namespace=args.namespace,
                missing_models=args.missing_models,
                dry_run=args.dry_run,
            )
            verb = "would delete" if args.dry_run else "deleted"
            print(f"{verb} {files} block files, {human_size(nbytes)}")
            return 0
        if not args.yes:
            print(
                f"{PROG}: error: clear deletes every block under {args.root}; add --yes",
                file=sys.stderr,
            )
            return 2
        files, nbytes = admin.clear(args.root)
        print(f"deleted {files} block files, {human_size(nbytes)}")
        return 0
    except (admin.StoreError, PinError, BundleError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
