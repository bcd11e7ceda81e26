"""L3: what the disk tier tells the operator in the log, each kind once.

Scheduler thread of the engine-core process. A failing disk fails the same
way many times a second; the first occurrence of each kind is logged with
the value and the fix, later ones only count in the metrics.
"""

from __future__ import annotations

from pathlib import Path

from vllm_uma.kv_offload.disk.metrics import LOADS_GIVEN_UP, STORE_FAILED
from vllm_uma.kv_offload.disk.settings import DiskTierSettings, GiB
from vllm_uma.kv_offload.lower_tier.reports import TierReports, Warnings
from vllm_uma.log import get_logger

logger = get_logger(__name__)

# A bad block file's warning (counted and warned of by the lower tier's
# reports): its detail, its reason, the metric.
BAD_BLOCK = (
    "Disk KV tier: a block file is not served, deleted, and recomputed "
    "(%s). Later %s blocks count in %s and are not logged."
)


class DiskWarnings:
    def __init__(self, root_dir: Path):
        self._root_dir = root_dir
        # Each kind once for the process's life: a failing disk fails the
        # same way many times a second until someone acts.
        self.once = Warnings(logger)
        self._once = self.once.warn

    def disk_full(self, detail: str, retry_in_s: float) -> None:
        # Each pause is logged: pauses are at least 5 s apart (full_disk.py).
        logger.warning(
            "Disk KV tier: the volume of %s is full (%s). Disk stores pause and are "
            "tried again in %.0f s, then less often, until there is space; serving "
            "goes on from RAM, and blocks already on disk are still restored. Free "
            "space on that volume or lower max_size_gib.",
            self._root_dir,
            detail,
            retry_in_s,
        )

    def settle_put_off(self, detail: str) -> None:
        logger.warning(
            "Disk KV tier: the volume of %s is full (%s), so this start-up could not "
            "bring the shared ledger up to date with the block files (a crashed server's "
            "writes, files added or removed by hand) nor within the cap. The blocks the "
            "ledger lists are restored meanwhile; that work is done as soon as a store "
            "finds space. Free space on that volume or lower max_size_gib.",
            self._root_dir,
            detail,
        )

    def settled_late(self, evicted: int) -> None:
        logger.info(
            "Disk KV tier: the ledger under %s is up to date with the block files again "
            "(%d block(s) evicted to fit the cap).",
            self._root_dir,
            evicted,
        )

    def space_is_back(self) -> None:
        logger.info(
            "Disk KV tier: there is space again under %s; disk stores resume.", self._root_dir
        )

    def store_error(self, detail: str) -> None:
        self._once(
            "store " + detail.split(":", 1)[0],  # one warning per errno
            "Disk KV tier: a block could not be written (%s); it stays in RAM only. "
            "Later errors of this kind count in %s and are not logged.",
            detail,
            STORE_FAILED,
        )

    def unlink(self, detail: str) -> None:
        self._once(
            "unlink",
            "Disk KV tier: a block file could not be deleted (%s); it may keep "
            "the disk above its cap. Check the permissions under %s.",
            detail,
            self._root_dir,
        )

    def load_error(self, detail: str) -> None:
        self._once(
            "load_error",
            "Disk KV tier: a restore failed in vllm-uma itself (%s), not in the file; "
            "the block is recomputed and its file kept. Please report this.",
            detail,
        )

    def late_loads(self, count: int, deadline_s: float) -> None:
        self._once(
            "late_loads",
            "Disk KV tier: %d block restore(s) had not started after %.0f s and were "
            "given up (the blocks are recomputed). Every I/O thread busy or stuck on "
            "%s? Later ones count in %s and are not logged.",
            count,
            deadline_s,
            self._root_dir,
            LOADS_GIVEN_UP,
        )

    def ledger(self, detail: str) -> None:
        self._once(
            "ledger",
            "Disk KV tier: the shared ledger could not be written (%s); the block "
            "stays in RAM only. Locked or busy: another process holds it for long; an "
            "I/O error or a read-only database: the kernel log (dmesg) says what the "
            'volume did. Later failures count in %s{reason="ledger"}.',
            detail,
            STORE_FAILED,
        )

    def ledger_rebuilt(self, path: Path, detail: str, aside: Path) -> None:
        logger.warning(
            "Disk KV tier: the shared ledger %s is damaged (%s); it was moved to %s "
            "and is rebuilt from the block files.",
            path,
            detail,
            aside,
        )

    def ledger_busy(self, path: Path, step: str, wait_s: float) -> None:
        self._once(
            "ledger-busy",
            "Disk KV tier: another process holds the shared ledger %s (a server reconciling "
            "a large store at its start-up, or a `vllm-uma kv-store` command); %s waits for "
            "it, up to %.0f s.",
            path,
            step,
            wait_s,
        )

    def scanning(self) -> None:
        logger.info("Disk KV tier: reading the store under %s ...", self._root_dir)

    def stopped(self, written: int, dropped_stores: int) -> None:
        logger.info(
            "Disk KV tier stopped: %d block(s) written to %s since start-up; %d "
            "store(s) still queued at the stop's deadline were dropped (those "
            "blocks are recomputed if they come back).",
            written,
            self._root_dir,
            dropped_stores,
        )

    def stuck_threads(self, count: int) -> None:
        self._once(
            "stuck",
            "Disk KV tier: %d I/O thread(s) still inside a read or write after "
            "the stop's wait; left behind (the process is stopping). A hung "
            "file system under %s?",
            count,
            self._root_dir,
        )

    def namespace_file(self, detail: str) -> None:
        self._once(
            "namespace.json",
            "Disk KV tier: could not write the namespace description (%s); blocks "
            "are stored all the same. Check the free space and permissions of %s.",
            detail,
            self._root_dir,
        )


def log_startup(
    reports: TierReports,
    settings: DiskTierSettings,
    files: int,
    ours: int,
    nbytes: int,
    evicted: int,
    temps: int,
    io: str,
) -> None:
    cap = "none" if settings.cap_bytes is None else f"{settings.cap_bytes / GiB:.2f} GiB"
    found = f"{files} block files ({ours} of this namespace), {nbytes / GiB:.2f} GiB"
    kept = f"cap {cap} ({settings.cap_reason}), {evicted} evicted to fit it"
    temps_removed = f"{temps} leftover temp files removed"
    reports.started(
        "Disk KV tier (L3)", str(settings.root_dir), [f"{found}, {kept}", temps_removed, io]
    )
