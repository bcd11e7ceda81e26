"""``python -m tools.crash_campaign --kills 200``: the crash campaign's command.

Prints what it runs, a progress line every 50 kills, then
``kills=N rounds=N violations=N`` and each violation; exits 1 if there was
any. The store is a fresh directory (``--root``: kept afterwards for a
look; by default a temporary one, removed when nothing was found).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tools.crash_campaign.driver import Campaign


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("kills", "servers", "cap_blocks"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            sys.exit(f"{flag} {getattr(args, name)}: it must be at least 1")
    seed = args.seed if args.seed is not None else time.time_ns() % 2**32
    root = args.root or Path(tempfile.mkdtemp(prefix="vllm-uma-crash-"))
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
    )
    tally = campaign.run(args.kills)
    print(f"{tally.line()} in {time.monotonic() - started:.0f} s", flush=True)
    for line in tally.violations:
        print(f"  violation: {line}")
    if tally.violations:
        print(f"the store is kept at {root} for a look (seed {seed} repeats the run)")
        return 1
    if args.root is None:
        shutil.rmtree(root)
    shutil.rmtree(logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
