"""``python -m tools.crash_campaign --kills 200``: the crash campaign's command.

Prints what it runs, a progress line every 50 kills, then
``kills=N rounds=N violations=N`` and each violation; exits 1 if there was
any. The store is a fresh directory (``--root``: kept afterwards for a
look; by default a temporary one, removed when nothing was found).
``--full-disk-share 0.3`` runs that share of the rounds on a full disk: the
store then lives on a small tmpfs of the campaign's own (root only),
unmounted at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tools.crash_campaign import worker
from tools.crash_campaign.disk_full import SmallFsError, mount_small_fs, unmount
from tools.crash_campaign.driver import Campaign
from vllm_uma.kv_offload.disk.block_file import file_bytes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.crash_campaign", description=__doc__)
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs in all (default 200)")
    parser.add_argument("--servers", type=int, default=3, help="servers sharing the store")
    parser.add_argument(
        "--cap-blocks", type=int, default=256, help="the store's cap, in blocks (default 256)"
    )
    parser.add_argument("--seed", type=int, default=None, help="for a run to be repeated")
    parser.add_argument(
        "--traffic-s",
        type=float,
        default=0.5,
        help="a kill under traffic comes up to this long after the round starts",
    )
    parser.add_argument("--root", type=Path, default=None, help="an empty directory for the store")
    parser.add_argument(
        "--full-disk-share",
        type=float,
        default=0.0,
        help="the share of rounds run with the store's file system full (needs root)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("kills", "servers", "cap_blocks"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            sys.exit(f"{flag} {getattr(args, name)}: it must be at least 1")
    if not 0.0 <= args.full_disk_share <= 1.0:
        sys.exit(f"--full-disk-share {args.full_disk_share}: it must be between 0 and 1")
    if args.full_disk_share and args.root is not None:
        sys.exit(
            "--full-disk-share fills the file system the store is on: drop --root, the "
            "campaign then puts its store on a small tmpfs of its own"
        )
    seed = args.seed if args.seed is not None else time.time_ns() % 2**32
    mount = filler = None
    if args.full_disk_share:
        mount = Path(tempfile.mkdtemp(prefix="vllm-uma-crash-fs-"))
        # Room for the cap twice over, the writes in flight and the ledger, whose
        # WAL alone reaches 4 MiB between checkpoints: a round drawn not full
        # must have space, or its start-up could not reconcile.
        size = 2 * args.cap_blocks * file_bytes(worker.ROW_BYTES) + (32 << 20)
        try:
            mount_small_fs(mount, size)
        except SmallFsError as exc:
            mount.rmdir()
            sys.exit(f"crash campaign: {exc}")
        filler = mount / "filler"
    try:
        return _run(args, seed, mount, filler)
    finally:
        if mount is not None:
            unmount(mount)
            mount.rmdir()


def _run(args, seed: int, mount: Path | None, filler: Path | None) -> int:
    root = args.root or Path(tempfile.mkdtemp(prefix="vllm-uma-crash-", dir=mount))
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if any(root.iterdir()):
        sys.exit(f"--root {root}: not empty; the campaign needs a store of its own")
    logs = Path(tempfile.mkdtemp(prefix="vllm-uma-crash-logs-"))
    print(
        f"crash campaign: {args.servers} servers on one store of {args.cap_blocks} blocks at "
        f"{root}, {args.kills} kills, seed {seed}; servers' log {logs / 'servers.log'}",
        flush=True,
    )
    started = time.monotonic()
    campaign = Campaign(
        root,
        logs,
        servers=args.servers,
        cap_blocks=args.cap_blocks,
        seed=seed,
        traffic_s=args.traffic_s,
        progress=lambda tally: print(f"  {tally.line()}", flush=True),
        filler=filler,
        full_share=args.full_disk_share,
    )
    tally = campaign.run(args.kills)
    print(f"{tally.line()} in {time.monotonic() - started:.0f} s", flush=True)
    for line in tally.violations:
        print(f"  violation: {line}")
    if tally.violations:
        if mount is not None:  # the tmpfs goes at the end: keep a copy on disk
            root = Path(shutil.copytree(root, tempfile.mkdtemp(prefix="vllm-uma-crash-kept-"),
                                        dirs_exist_ok=True))  # fmt: skip
        print(f"the store is kept at {root} for a look (seed {seed} repeats the run)")
        return 1
    if args.root is None:
        shutil.rmtree(root)
    shutil.rmtree(logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
