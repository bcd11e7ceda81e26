"""Pinned prefixes on real servers (docs/sessions.md, kv_offload/pins/).

The default model in float32 (token ids exact), 32-token blocks (the
default), a disk tier whose cap a pinned system prompt of about 8,000
tokens nearly fills (pin_share 0.9), a host pool that holds it too:

- the system prompt is served twice (the second an L1 hit: the reference
  tokens), pinned through POST /v1/uma/pins for a day, and a control prompt
  is served unpinned; then traffic of ten times the disk cap in other
  prompts goes through the server;
- a second server starts on the same store while the first runs: it lists
  the same pin (one pin for the servers of a store); the first stops;
- the second server serves the system prompt: every full block restored
  from disk (vLLM's cached-by-source counter), the reference tokens; the
  unpinned control prompt restores nothing (its blocks were evicted) and is
  recomputed;
- a pin over the budget is refused with its numbers (409);
- the pin is exported as a bundle over HTTP (GET /v1/uma/pins/system/bundle)
  and imported into a fresh store of a third server, as another host would
  (POST /v1/uma/pins/import, while it runs): it restores every full block
  with the reference tokens; that server also warms a greeting from ``--warm FILE``
  once it answers /health; the same bundle is refused by a store of another model
  (Gemma 3's) through ``vllm-uma kv-store ROOT export`` and ``import``,
  with the reason and nothing written;
- the pin is unpinned at the end, for every server.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.disk_store import KV_PER_TOKEN, start
from tests.e2e.traffic import EAGER, MODEL, WORDS, metrics
from tools.harness.server import metric
from vllm_uma.kv_offload.disk import block_file

pytestmark = pytest.mark.slow

BLOCK_TOKENS = 32  # vllm-uma's default KV block
BLOCK_FILE_BYTES = block_file.file_bytes(BLOCK_TOKENS * KV_PER_TOKEN)
CAP_GIB = 0.4  # 290 blocks: the pinned prompt (250) fits pin_share 0.9 of it
# 727 rows: the pin (250) and two traffic requests in flight (62 each) at once.
POOL_GIB = 1.0
DISK_TOKENS = "vllm:prompt_tokens_cached_by_source_total"
EVICTIONS = "vllm:kv_offload_disk_evicted_blocks_total"
DAY_S = 86_400


def text(tag: str, words: int) -> str:
    """About two tokens per word, distinct from its first token on."""
    return f"{tag}: " + " ".join(WORDS[(k * 7 + len(tag)) % 8] + str(k % 10) for k in range(words))


SYSTEM = text("System prompt of the agent", 4_000)  # about 8,000 tokens
CONTROL = text("Control document", 1_000)
# Never the control prompt: a refused pin still stores its prompt's blocks.
OVER_BUDGET = text("Another long document", 1_000)
GREETING = text("Warm greeting", 150)  # about 300 tokens: 9 blocks
# About 2,000 tokens a request, two at a time: shorter prompts cost less
# attention per token, and two in flight keep both cores busy.
TRAFFIC_WORDS = 1_000
TRAFFIC_AT_ONCE = 2


def server_args(root: Path, dtype: str = "float32") -> list[str]:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": CAP_GIB, "pin_share": 0.9}
    return [
        *EAGER,
        "--dtype",
        dtype,
        "--max-model-len",
        "8192",
        # L1 holds one 8k prompt: every other prompt pushes the last out.
        "--kv-cache-memory-bytes",
        str(400_000_000),
        "--kv-offloading-size",
        str(POOL_GIB),
        "--kv-transfer-config",
        json.dumps({"kv_connector_extra_config": {"secondary_tiers": [tier]}}),
    ]


def tokens_of(server, prompt: str, max_tokens: int = 8) -> list[int]:
    reply = server.complete(MODEL, prompt, max_tokens, return_token_ids=True)
    return reply["choices"][0]["token_ids"]


def pins(server) -> list[dict]:
    reply = requests.get(f"{server.url}/v1/uma/pins", timeout=30)
    reply.raise_for_status()
    return reply.json()["pins"]


def wait_on_disk(server, name: str) -> dict:
    """The pin once every block of it is on disk (stores end after the reply)."""
    deadline = time.monotonic() + 120
    while True:
        (pin,) = [p for p in pins(server) if p["name"] == name]
        if pin["blocks_on_disk"] == pin["blocks"]:
            return pin
        assert time.monotonic() < deadline, f"pin {name} never fully on disk: {pin}"
        time.sleep(0.5)


def kv_store(exe: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, "kv-store", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def pinned(vllm_uma_exe, default_model_dir, gemma_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("pins")
    root, other_host, gemma_store = work / "kv", work / "host2-kv", work / "gemma-kv"
    logs = {name: tmp_path_factory.mktemp(name) for name in ("a", "b", "c", "d")}
    seen: dict = {}
    a = start(vllm_uma_exe, server_args(root), logs["a"])
    b = c = None
    try:
        seen["reference"] = [tokens_of(a, SYSTEM), tokens_of(a, SYSTEM)]
        made = requests.post(
            f"{a.url}/v1/uma/pins",
            json={"name": "system", "prompt": SYSTEM, "ttl_s": DAY_S},
            timeout=300,
        )
        seen["pin"] = made.json()
        assert made.status_code == 200, seen["pin"]
        seen["pin_on_disk"] = wait_on_disk(a, "system")
        # Over the budget: refused, though its prompt was prefilled and
        # stored (the warm-up runs first); before the traffic, which evicts it.
        seen["over_budget"] = requests.post(
            f"{a.url}/v1/uma/pins",
            json={"name": "more", "prompt": OVER_BUDGET, "ttl_s": 60},
            timeout=300,
        )
        tokens_of(a, CONTROL)
        # Traffic: other prompts, ten times the disk cap in block files.
        per_request = (2 * TRAFFIC_WORDS) // BLOCK_TOKENS * BLOCK_FILE_BYTES
        requests_needed = math.ceil(10 * CAP_GIB * (1 << 30) / per_request)
        started = time.monotonic()
        with ThreadPoolExecutor(TRAFFIC_AT_ONCE) as pool:
            prompts = [text(f"Traffic {i}", TRAFFIC_WORDS) for i in range(requests_needed)]
            list(pool.map(lambda p: tokens_of(a, p, max_tokens=1), prompts))
        seen["traffic"] = (requests_needed, time.monotonic() - started)
        seen["a_pins"] = pins(a)
        seen["a_metrics"] = metrics(a)
        # A second server on the store sees the pin; then the first stops.
        b = start(vllm_uma_exe, server_args(root), logs["b"])
        seen["b_pins_while_a_runs"] = pins(b)
        a.stop()
        seen["b_system"] = tokens_of(b, SYSTEM)
        seen["b_disk_after_system"] = metric(metrics(b), DISK_TOKENS, 'source="disk"')
        tokens_of(b, CONTROL)
        seen["b_disk_after_control"] = metric(metrics(b), DISK_TOKENS, 'source="disk"')
        # Carry the session: a bundle into a fresh store on "another host".
        bundle = work / "system.bundle"
        seen["export"] = kv_store(vllm_uma_exe, root, "export", "system", bundle)
        # It also warms a greeting at start (serve --warm), after /health.
        warm = work / "warm.json"
        warm.write_text(json.dumps([{"name": "greeting", "prompt": GREETING, "ttl_s": 600}]))
        c = start(vllm_uma_exe, [*server_args(other_host), "--warm", str(warm)], logs["c"])
        # Over HTTP: B streams the pin's bundle, C takes it into its store
        # (C asks its own engine for its namespace first).
        tar = requests.get(f"{b.url}/v1/uma/pins/system/bundle", timeout=300)
        seen["http_export"] = (tar.status_code, len(tar.content))
        seen["import"] = requests.post(
            f"{c.url}/v1/uma/pins/import",
            data=tar.content,
            headers={"Content-Type": "application/x-tar"},
            timeout=300,
        )
        deadline = time.monotonic() + 180
        while "Warm-up done" not in c.log() and time.monotonic() < deadline:
            time.sleep(1)
        seen["c_log"] = c.log()
        seen["c_pins"] = pins(c)
        seen["c_system"] = tokens_of(c, SYSTEM)
        seen["c_disk"] = metric(metrics(c), DISK_TOKENS, 'source="disk"')
        c.stop()
        # Another model's store: Gemma 3 registers its namespace there.
        gemma = [str(gemma_model_dir), *server_args(gemma_store)]
        start(vllm_uma_exe, gemma, logs["d"]).stop()
        seen["gemma_files_before"] = sorted(p.name for p in gemma_store.rglob("*"))
        seen["foreign_import"] = kv_store(vllm_uma_exe, gemma_store, "import", bundle)
        seen["gemma_files_after"] = sorted(p.name for p in gemma_store.rglob("*"))
        seen["unpinned"] = requests.delete(f"{b.url}/v1/uma/pins/system", timeout=30)
        seen["b_pins_after_unpin"] = pins(b)
        yield seen
    finally:
        for server in (a, b, c):
            if server is not None:
                server.stop()


def test_the_pin_holds_every_full_block_of_the_system_prompt(pinned):
    pin = pinned["pin"]
    assert pin["name"] == "system" and pin["blocks"] == pin["tokens"] // BLOCK_TOKENS
    assert pin["tokens"] > 7_500 and pin["bytes"] == pin["blocks"] * BLOCK_FILE_BYTES
    assert 0 < pin["ttl_s"] <= DAY_S


def test_traffic_of_ten_times_the_cap_evicts_and_the_pin_stays_on_disk(pinned):
    evicted = metric(pinned["a_metrics"], EVICTIONS)
    cap_blocks = CAP_GIB * (1 << 30) // BLOCK_FILE_BYTES
    assert evicted >= 9 * cap_blocks, (evicted, pinned["traffic"])
    (pin,) = pinned["a_pins"]
    assert pin["blocks_on_disk"] == pin["blocks"]


def test_a_pin_over_the_budget_is_refused_with_its_numbers(pinned):
    refused = pinned["over_budget"]
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert "'more' refused" in message and "pin budget" in message and "pin_share 0.9" in message


def test_another_server_on_the_store_sees_the_same_pin(pinned):
    (theirs,) = pinned["b_pins_while_a_runs"]
    assert theirs["name"] == "system" and theirs["namespace"] == pinned["pin"]["namespace"]
    assert theirs["blocks"] == pinned["pin"]["blocks"]


def test_after_a_restart_the_pinned_prompt_restores_every_block_with_the_l1_hit_tokens(pinned):
    cold, l1_hit = pinned["reference"]
    assert cold == l1_hit  # float32: exact
    assert pinned["b_system"] == l1_hit
    full = pinned["pin"]["tokens"] // BLOCK_TOKENS * BLOCK_TOKENS
    assert pinned["b_disk_after_system"] == full


def test_the_same_traffic_without_a_pin_recomputes_the_prompt(pinned):
    assert pinned["b_disk_after_control"] == pinned["b_disk_after_system"]


def test_a_bundle_carries_the_pin_to_another_hosts_store(pinned):
    assert pinned["export"].returncode == 0, pinned["export"].stderr
    status, size = pinned["http_export"]
    assert status == 200 and size > pinned["pin"]["bytes"]
    assert pinned["import"].status_code == 200, pinned["import"].text
    assert pinned["import"].json()["blocks_written"] == pinned["pin"]["blocks"]
    theirs = {p["name"]: p for p in pinned["c_pins"]}["system"]
    assert theirs["blocks"] == pinned["pin"]["blocks"]
    assert theirs["blocks_on_disk"] == theirs["blocks"]
    _, l1_hit = pinned["reference"]
    assert pinned["c_system"] == l1_hit
    assert pinned["c_disk"] == pinned["pin"]["tokens"] // BLOCK_TOKENS * BLOCK_TOKENS


def test_serve_warm_pins_its_file_after_health(pinned):
    log = pinned["c_log"]
    assert "Warm-up 1/1: 'greeting' pinned" in log and "Warm-up done: 1 of 1" in log
    greeting = {p["name"]: p for p in pinned["c_pins"]}["greeting"]
    assert greeting["blocks"] == greeting["tokens"] // BLOCK_TOKENS > 0
    assert 0 < greeting["ttl_s"] <= 600


def test_a_bundle_of_another_model_is_refused_and_nothing_is_written(pinned):
    refused = pinned["foreign_import"]
    assert refused.returncode != 0
    assert pinned["pin"]["namespace"] in refused.stderr
    assert pinned["gemma_files_after"] == pinned["gemma_files_before"]


def test_unpin_removes_it_for_every_server(pinned):
    assert pinned["unpinned"].status_code == 200
    assert pinned["b_pins_after_unpin"] == []
