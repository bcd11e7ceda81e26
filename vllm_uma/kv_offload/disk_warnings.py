"""L3: what the disk tier tells the operator in the log, each kind once.

Scheduler thread of the engine-core process. A failing disk fails the same
way many times a second; the first occurrence of each kind is logged with
the value and the fix, later ones only count in the metrics.
"""

from __future__ import annotations

from pathlib import Path

from vllm_uma.kv_offload.block_file import BadReason
from vllm_uma.kv_offload.disk_config import DiskTierConfig, GiB
from vllm_uma.kv_offload.disk_metrics import BAD_BLOCKS, STORE_FAILED
from vllm_uma.log import get_logger

logger = get_logger(__name__)


class DiskWarnings:
    def __init__(self, root_dir: Path):
        self._root_dir = root_dir
        self._seen: set[str] = set()

    def _once(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._seen:
            self._seen.add(kind)
            logger.warning(msg, *args)

    def disk_full(self, detail: str) -> None:
        self._once(
            "disk_full",
            "Disk KV tier: the volume of %s is full (%s). This server writes no more "
            "KV blocks to disk; serving goes on from RAM, and blocks already on disk "
            "are still restored. Free space on that volume or lower max_size_gib, "
            "then restart the server.",
            self._root_dir,
            detail,
        )

    def store_error(self, detail: str) -> None:
        self._once(
            "store " + detail.split(":", 1)[0],  # one warning per errno
            "Disk KV tier: a block could not be written (%s); it stays in RAM only. "
            "Later errors of this kind count in %s and are not logged.",
            detail,
            STORE_FAILED,
        )

    def bad_block(self, reason: BadReason, detail: str) -> None:
        self._once(
            "bad " + reason.value,
            "Disk KV tier: a block file is not served, deleted, and recomputed "
            "(%s). Later %s blocks count in %s and are not logged.",
            detail,
            reason.value,
            BAD_BLOCKS,
        )

    def unlink(self, detail: str) -> None:
        self._once(
            "unlink",
            "Disk KV tier: a block file could not be deleted (%s); it may keep "
            "the disk above its cap. Check the permissions under %s.",
            detail,
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
    config: DiskTierConfig, files: int, ours: int, nbytes: int, evicted: int, temps: int, io: str
) -> None:
    cap = "none" if config.cap_bytes is None else f"{config.cap_bytes / GiB:.2f} GiB"
    logger.info(
        "Disk KV tier (L3) at %s: %d block files (%d of this namespace), %.2f GiB, "
        "cap %s (%s), %d evicted to fit it; %d leftover temp files removed; %s.",
        config.root_dir,
        files,
        ours,
        nbytes / GiB,
        cap,
        config.cap_reason,
        evicted,
        temps,
        io,
    )
