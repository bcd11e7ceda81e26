"""L3: what the disk tier reports of its own: its /metrics counters and its log lines.

Scheduler thread of the engine-core process (and the tier's start-up), on
top of the lower tier's reports (../lower_tier/reports.py: the counters
every tier has, KV events, bad values, the start-up line's shape). The
metrics: the names and Prometheus definitions of the disk tier's counters
(``definitions``, the tier's ``build_metric_definitions``); vLLM ships the
counts to the API server's /metrics, where a counter gets ``_total``:
``vllm:kv_offload_disk_written_blocks_total``. The log: a failing disk
fails the same way many times a second; the first occurrence of each kind
is logged with the value and the fix (``DiskWarnings``), later ones only
count in the metrics.
"""

from __future__ import annotations

from pathlib import Path

from vllm.v1.kv_offload.base import (
    Locality,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

from vllm_uma.kv_offload.disk.settings import DiskTierSettings, GiB
from vllm_uma.kv_offload.lower_tier.metrics import TierMetrics
from vllm_uma.kv_offload.lower_tier.reports import TierReports, Warnings
from vllm_uma.log import get_logger

NAMES = TierMetrics("disk", "the disk tier", bad="bad_blocks")
EVICTED_BLOCKS = NAMES.prefix + "evicted_blocks"
PEER_CHANGES = NAMES.prefix + "peer_changes"
LOADS_GIVEN_UP = NAMES.prefix + "loads_given_up"
USED_BYTES = NAMES.prefix + "used_bytes"
CAP_BYTES = NAMES.prefix + "cap_bytes"
PINNED_BLOCKS = NAMES.prefix + "pinned_blocks"
PINNED_BYTES = NAMES.prefix + "pinned_bytes"


def definitions() -> dict[str, OffloadingMetricMetadata]:
    counter, gauge = OffloadingCounterMetadata, OffloadingGaugeMetadata
    return {
        **NAMES.moved_definitions(),
        EVICTED_BLOCKS: counter("Block files deleted to stay within the disk cap."),
        NAMES.bad_values: counter(
            "Block files found unusable on restore (then deleted and recomputed), "
            "by reason: missing, truncated, corrupted, foreign, unreadable, not_a_file, and "
            "with signed block files unsigned, unknown_key, forged (block_mac.py).",
            labelnames=("reason",),
        ),
        NAMES.store_skipped: counter(
            "Blocks not written because the store already holds them or is "
            "writing or deleting them (this server or another), by reason.",
            labelnames=("reason",),
        ),
        NAMES.store_failed: counter(
            "Blocks the disk tier could not write, by reason: too_big, no_room "
            "(everything else pinned), disk_full, io_error, ledger (the shared "
            "ledger was busy or unwritable).",
            labelnames=("reason",),
        ),
        LOADS_GIVEN_UP: counter(
            "Block restores still queued past their deadline, given up and "
            "recomputed (I/O threads stuck on a hung file system?)."
        ),
        PEER_CHANGES: counter(
            "Blocks of this server's namespace that other servers on the same "
            "store added or removed, seen through the shared ledger, by change.",
            labelnames=("change",),
        ),
        USED_BYTES: gauge(
            "Bytes of block files under root_dir, all namespaces and servers (the ledger's count)."
        ),
        CAP_BYTES: gauge("The disk tier's cap in bytes (0: no cap)."),
        PINNED_BLOCKS: gauge(
            "Block files of this server's namespace on disk that live pins hold "
            "(docs/sessions.md); read from the shared ledger every second."
        ),
        PINNED_BYTES: gauge("Bytes of those pinned block files."),
    }


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
            NAMES.store_failed,
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
            NAMES.store_failed,
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


def tier_reports(
    settings: DiskTierSettings, medium: Medium, locality: Locality, warnings: DiskWarnings
) -> TierReports:
    """The disk tier's counts, KV events and start-up line (lower_tier/reports.py)."""
    # KV events without an ownership, as vLLM's own fs tier: one marks a
    # pool shared by many engines (kvcr), which a router credits as remote
    # and refuses with LOCAL locality.
    reports = TierReports(NAMES, medium, locality, settings.enable_kv_events, warnings.once)
    reports.stats.gauge(CAP_BYTES, settings.cap_bytes or 0)
    return reports


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
