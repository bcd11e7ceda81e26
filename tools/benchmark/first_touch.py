"""What touching fresh RAM costs here, with 4 KiB pages and with huge pages.

    .venv/bin/python -m tools.benchmark.first_touch --gib 1 --repeats 4

The KV cache (L1) is allocated lazily, so a block's first write faults its
pages in, and a restore into fresh L1 pays for it (docs/measurements.md,
"Where a restore's time goes"). Transparent huge pages would take one
fault per 2 MiB instead of 512: this tool maps anonymous private memory
like the KV buffer, asks for huge pages or not (``MADV_HUGEPAGE``), faults
every page in at once (``MADV_POPULATE_WRITE``, as the warm reserve does)
and prints the time, alternating the two kinds so that drift hits both.
It needs the kernel's THP mode ``madvise`` or ``always``
(/sys/kernel/mm/transparent_hugepage/enabled) and says which it found.
"""

from __future__ import annotations

import argparse
import mmap
import time
from pathlib import Path

from vllm_uma.memory_release.pages import MADV_POPULATE_WRITE

MADV_HUGEPAGE = 14  # linux/mman.h
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def anon_huge_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def touch_seconds(nbytes: int, huge: bool) -> tuple[float, int]:
    """Seconds to fault ``nbytes`` of fresh anonymous memory in, and the KiB
    of it the kernel backed with huge pages."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        before = anon_huge_kib()
        if huge:
            region.madvise(MADV_HUGEPAGE)
        start = time.perf_counter()
        region.madvise(MADV_POPULATE_WRITE)
        return time.perf_counter() - start, anon_huge_kib() - before
    finally:
        region.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="memory touched per run")
    ap.add_argument("--repeats", type=int, default=4, help="runs of each kind, alternating")
    args = ap.parse_args(argv)
    mode = THP_MODE.read_text().strip() if THP_MODE.exists() else "absent"
    print(f"transparent huge pages: {mode}")
    if "[never]" in mode or mode == "absent":
        print("first_touch: huge pages are off here; only 4 KiB pages can be measured")
    nbytes = int(args.gib * 2**30)
    for i in range(args.repeats):
        for huge in (False, True):
            seconds, huge_kib = touch_seconds(nbytes, huge)
            kind = "huge pages" if huge else "4 KiB pages"
            print(
                f"run {i + 1} {kind:11}: {seconds:.3f} s, {nbytes / seconds / 1e9:.2f} GB/s "
                f"({huge_kib * 1024 / nbytes:.0%} in huge pages)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
