"""``vllm-uma kv-store ROOT pins|unpin|export|import``: a store's pins, and a pin carried.

    vllm-uma kv-store ROOT pins                            live pins: model, blocks, expiry
    vllm-uma kv-store ROOT unpin NAME [--namespace HEX]    remove one
    vllm-uma kv-store ROOT export NAME OUT_DIR [--namespace HEX]
    vllm-uma kv-store ROOT import BUNDLE_DIR [--ttl-s S] [--max-size-gib G] [--pin-share F]

Parsing and printing only: the pins are kv_offload/pins/book.py's (the same
calls and messages as the HTTP API, ``/v1/uma/pins``), a bundle's format
and checks pins/bundle.py's, its writing pins/bundle_export.py's and
pins/bundle_import.py's. Safe while servers use the store: every change is
one ledger transaction, as a server's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.layout import NOINDEX
from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.bundle_export import export_pin
from vllm_uma.kv_offload.pins.bundle_import import StoreLimits, import_bundle
from vllm_uma.log import human_size

COMMANDS = ("pins", "unpin", "export", "import")


def add_parsers(commands) -> None:
    commands.add_parser("pins", help="live pins: model, tokens, blocks, bytes, expiry")
    unpin = commands.add_parser("unpin", help="remove a pin (its blocks become LRU blocks)")
    unpin.add_argument("name", help="the pin's name (from `pins`)")
    unpin.add_argument(
        "--namespace", metavar="HEX", help="which model's pin, if several have that name"
    )
    export = commands.add_parser(
        "export", help="write a pin's blocks on disk (its longest prefix) as a bundle directory"
    )
    export.add_argument("name", help="the pin's name (from `pins`)")
    export.add_argument("out_dir", type=Path, help="the bundle directory to make (must not exist)")
    export.add_argument(
        "--namespace", metavar="HEX", help="which model's pin, if several have that name"
    )
    imp = commands.add_parser(
        "import", help="check a bundle, write its blocks into this store and pin them"
    )
    imp.add_argument("bundle", type=Path, help="a directory `export` wrote")
    imp.add_argument(
        "--ttl-s", type=float, metavar="S", help="the pin lives S s (default: what was left of it)"
    )
    imp.add_argument(
        "--max-size-gib", type=float, metavar="G",
        help="the store's cap, as its servers' fs tier has it (0: none; default: 10%% of the "
        "volume, a server's default)",
    )  # fmt: skip
    imp.add_argument(
        "--pin-share", type=float, metavar="F",
        help="the share of the cap pins may hold, as the servers' fs tier has it (default 0.5)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """A pins command; raises admin.StoreError or book.PinError (the caller
    prints it)."""
    if args.command == "pins":
        return _pins(args.root)
    if args.command == "export":
        return _export(args.root, args.name, args.out_dir, namespace_arg(args.namespace))
    if args.command == "import":
        limits = StoreLimits.of(args.root, args.max_size_gib, args.pin_share)
        return _import(args.root, args.bundle, limits, args.ttl_s)
    return _unpin(args.root, args.name, namespace_arg(args.namespace))


def namespace_arg(value: str | None) -> bytes | None:
    return book.namespace_arg(value, "`pins`")


def _pins(root: Path) -> int:
    ledger = admin.open_ledger(root)
    pins = [] if ledger is None else book.pins(ledger)
    if ledger is not None:
        ledger.close()
    now = time.time()
    print(
        f"{'name':24} {'model':30} {'namespace':32} {'tokens':>7} {'blocks':>6} "
        f"{'size':>10} {'on disk':>7}  expires"
    )
    for p in pins:
        info = admin.read_info(root / NOINDEX / p.namespace.hex()) or {}
        model = str(info.get("model", "?"))
        print(
            f"{p.name:24} {model[-30:]:30} {p.namespace.hex():32} {p.tokens:7d} {p.blocks:6d} "
            f"{human_size(p.bytes):>10} {p.blocks_on_disk:7d}  {expiry(p.expires, now)}"
        )
    if not pins:
        print("(no pins)")
    return 0


def expiry(expires: float | None, now: float) -> str:
    if expires is None:
        return "until unpinned"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(expires))
    left = max(0.0, expires - now)
    return f"{when} (in {left / 3600:.1f} h)" if left >= 3600 else f"{when} (in {left:.0f} s)"


def _unpin(root: Path, name: str, namespace: bytes | None) -> int:
    ledger = admin.open_ledger(root)
    if ledger is None:
        raise book.PinNotFound(f"no pin named {name!r}: this store has no ledger, so no pins.")
    try:
        gone = book.unpin(ledger, name, namespace)
    finally:
        ledger.close()
    for p in gone:
        print(f"unpinned {p.name!r} (namespace {p.namespace.hex()}, {p.blocks} blocks)")
    return 0


def _export(root: Path, name: str, out_dir: Path, namespace: bytes | None) -> int:
    done = export_pin(root, name, out_dir, namespace)
    m = done.manifest
    size = human_size(sum(b.size for b in m.blocks))
    print(
        f"exported pin {name!r} (model {m.model}, namespace {m.namespace.hex()}): "
        f"{len(m.blocks)} of its {len(m.pin.keys)} blocks, {size}, to {out_dir}"
    )
    if done.stopped is not None:
        print(f"only a prefix: it stops where the disk does, at {done.stopped}")
    return 0


def _import(root: Path, bundle: Path, limits: StoreLimits, ttl_s: float | None) -> int:
    done = import_bundle(root, bundle, limits, ttl_s)
    m, pin = done.manifest, done.pin
    cap = "no cap" if limits.cap_bytes is None else human_size(limits.cap_bytes)
    print(
        f"imported pin {pin.name!r} (model {m.model}, namespace {m.namespace.hex()}): "
        f"{done.written} blocks written, {done.already} already in the store, "
        f"{pin.blocks_on_disk} of its {pin.blocks} blocks on disk; cap {cap} "
        f"({limits.cap_reason}); {expiry(pin.expires, time.time())}"
    )
    return 0
