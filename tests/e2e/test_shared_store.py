"""One disk store shared by several real servers (docs/kv_offloading.md).

All servers run the default model in float32 on one root_dir whose cap holds
twenty blocks, a quarter of their traffic (tests/e2e/disk_store.py):

- S1 and S2 start together and serve different prompts at the same time;
  S3 starts while they store, then the three serve at once. A sampler reads
  the bytes of block and temp files every 20 ms: one cap for all, never
  crossed by more than one block per server in flight.
- S1 serves a new prompt alone; once its blocks are on disk, S2 and S3
  serve it too: their prefixes come from the disk (S1's blocks, found
  through the shared ledger) and their tokens equal S1's, exactly.
- Nobody deletes another's writes in flight: no store fails with an I/O
  error (a temp file deleted under its writer fails its rename), and S3's
  start-up scan removed no temp file.
- S1 is stopped (its disk tier drains) while S4 starts on the same root:
  S4 restores S1's last prompt from disk, with S1's tokens.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.disk_store import BLOCK_FILE_BYTES, BLOCK_TOKENS, disk_args, start, store_bytes
from tests.e2e.traffic import complete, metrics
from tools.harness.server import metric
from vllm_uma.kv_offload.disk.ledger.db import LEDGER_FILE

pytestmark = pytest.mark.slow

CAP_BLOCKS = 20  # two prompts of 9 full blocks fit; the traffic is four times that
DISK_HITS = "vllm:prompt_tokens_cached_by_source_total"
STORE_FAILED = "vllm:kv_offload_disk_store_failed_blocks_total"
EVICTIONS = "vllm:kv_offload_disk_evicted_blocks_total"
PEER_ADDED = "vllm:kv_offload_disk_peer_changes_total"


def temps_removed_at_start(log: str) -> int:
    found = re.search(r"(\d+) leftover temp files removed", log)
    assert found, "no disk tier start-up line in the server's log"
    return int(found.group(1))


def ledger_adds(root: Path) -> int:
    """Blocks committed to the store so far (the shared ledger's feed)."""
    db = sqlite3.connect(f"file:{root / '.noindex' / LEDGER_FILE}?mode=ro", uri=True)
    try:
        return db.execute("SELECT count(*) FROM changes WHERE added=1").fetchone()[0]
    finally:
        db.close()


def serve_and_store(server, root: Path, i: int, topic: str) -> list[int]:
    """Serve one prompt alone and wait until its 9 full blocks are on disk
    (stores finish after the reply)."""
    before = ledger_adds(root)
    tokens = complete(server, i, topic)
    deadline = time.monotonic() + 60
    while ledger_adds(root) < before + 9:
        assert time.monotonic() < deadline, "the prompt's blocks never reached the disk"
        time.sleep(0.1)
    return tokens


@pytest.fixture(scope="module")
def shared(vllm_uma_exe, default_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("shared-store") / "kv"
    cap = CAP_BLOCKS * BLOCK_FILE_BYTES
    args = disk_args(root, cap_gib=cap / (1 << 30))
    logs = {name: tmp_path_factory.mktemp(name) for name in ("s1", "s2", "s3", "s4")}
    sizes: list[int] = []
    sampling = threading.Event()
    sampling.set()

    def sample():
        while sampling.is_set():
            sizes.append(store_bytes(root))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    servers = {}
    out: dict = {"cap": cap}
    with ThreadPoolExecutor(max_workers=6) as pool:
        try:
            s1, s2 = pool.map(lambda n: start(vllm_uma_exe, args, logs[n]), ["s1", "s2"])
            servers.update(s1=s1, s2=s2)
            sampler.start()
            # Two servers store at once, over the cap; S3 starts meanwhile.
            busy = [pool.submit(complete, s1, i, "Shared") for i in range(3)]
            busy += [pool.submit(complete, s2, i, "Other") for i in range(3)]
            servers["s3"] = s3 = start(vllm_uma_exe, args, logs["s3"])
            # Then three at once.
            busy += [
                pool.submit(complete, s, 3, name)
                for s, name in ((s1, "Shared"), (s2, "Other"), (s3, "Third"))
            ]
            for future in busy:
                future.result()
            # One server stores a prompt; the two others restore it.
            out["s1_handoff"] = serve_and_store(s1, root, 0, "Handoff")
            out["s2_handoff"] = complete(s2, 0, "Handoff")
            out["s3_handoff"] = complete(s3, 0, "Handoff")
            out["metrics"] = {name: metrics(s) for name, s in servers.items()}
            # S1 stores one more, and drains while S4 starts on the same root.
            out["s1_last"] = serve_and_store(s1, root, 1, "Handoff")
            stopping = pool.submit(servers.pop("s1").stop)
            servers["s4"] = s4 = start(vllm_uma_exe, args, logs["s4"])
            stopping.result()
            out["s4_from_s1"] = complete(s4, 1, "Handoff")
            out["s4_metrics"] = metrics(s4)
        finally:
            sampling.clear()
            for server in servers.values():
                server.stop()
    out["sizes"] = sizes
    out["s3_log"] = (logs["s3"] / "server.log").read_text()
    return out


def test_one_cap_holds_for_all_servers(shared):
    assert shared["sizes"], "the sampler saw nothing"
    # At most three servers store at once, one block in flight each.
    assert max(shared["sizes"]) <= shared["cap"] + 3 * BLOCK_FILE_BYTES
    assert sum(metric(text, EVICTIONS) for text in shared["metrics"].values()) > 0


def test_a_block_stored_by_one_server_is_restored_by_another(shared):
    for name in ("s2", "s3"):
        text = shared["metrics"][name]
        assert metric(text, PEER_ADDED, 'change="added"') > 0, name
        assert metric(text, DISK_HITS, 'source="disk"') >= BLOCK_TOKENS, name
    assert shared["s2_handoff"] == shared["s1_handoff"]
    assert shared["s3_handoff"] == shared["s1_handoff"]


def test_no_server_deletes_another_servers_writes(shared):
    for name, text in shared["metrics"].items():
        assert metric(text, STORE_FAILED, 'reason="io_error"') == 0, name
    assert temps_removed_at_start(shared["s3_log"]) == 0


def test_a_server_started_while_the_previous_one_drains_finds_its_blocks(shared):
    assert metric(shared["s4_metrics"], DISK_HITS, 'source="disk"') >= BLOCK_TOKENS
    assert shared["s4_from_s1"] == shared["s1_last"]
