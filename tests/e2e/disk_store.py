"""The disk tier's e2e settings and what the tests read off a store.

Servers run the default model in float32 (tests/e2e/test_disk_tier.py says
why) with an L1 too small for two prompts, a host pool and a disk tier.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.traffic import BLOCKS_OF_128, EAGER
from vllm_uma.kv_offload.disk import block_file
from vllm_uma.server_process import Server

# 18 float32 blocks (17 usable): room for one 2,048-token request, not for
# two prompts of 10 blocks (9 full and the tail).
SMALL_L1 = [
    *EAGER,
    *BLOCKS_OF_128,
    "--dtype",
    "float32",
    "--kv-cache-memory-bytes",
    "110000000",
    "--max-model-len",
    "2048",
]
BLOCK_TOKENS = 128  # the KV block these servers run with (BLOCKS_OF_128)
KV_PER_TOKEN = 46_080  # SmolLM2-135M in float32: 2 x 30 layers x 3 heads x 64 x 4 B
BLOCK_FILE_BYTES = block_file.file_bytes(BLOCK_TOKENS * KV_PER_TOKEN)  # a row of KV + header
POOL_GIB = 0.3  # 54 float32 blocks: A's four prompts (36 blocks) fit


def disk_args(root: Path, cap_gib: float) -> list[str]:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": cap_gib}
    config = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return [
        *SMALL_L1,
        "--kv-offloading-size",
        str(POOL_GIB),
        "--kv-transfer-config",
        json.dumps(config),
    ]


def block_files(root: Path) -> list[Path]:
    return sorted((root / ".noindex").rglob(f"*{block_file.BLOCK_SUFFIX}"))


def leftovers(root: Path) -> list[Path]:
    return [p for p in (root / ".noindex").rglob("*") if block_file.is_temp_name(p.name)]


def namespace_of(path: Path) -> bytes:
    """The namespace id in a block file's header."""
    with open(path, "rb") as f:
        return f.read(40)[24:40]  # see the layout in block_file.py


def store_bytes(root: Path) -> int:
    """Bytes of block files and temp files under ``root`` (what the cap
    covers; the ledger's few pages are not blocks)."""
    total = 0
    for path in (root / ".noindex").rglob("*"):
        name = path.name
        if name.endswith(block_file.BLOCK_SUFFIX) or block_file.is_temp_name(name):
            try:
                total += path.lstat().st_size
            except FileNotFoundError:  # renamed or evicted meanwhile
                pass
    return total


def start(exe, args, log_dir: Path) -> Server:
    return Server(exe, args, log_dir / "server.log").wait_ready()
