"""KV planted in the network tier's KV server steers no signed server (issue 44, item 1).

The default model in float32 (exact tokens), a network tier alone on a
valkey-server on loopback, the fleet's secret beside it (KvServer.tier):

- server A serves a prompt cold, then again (an L1 hit: the reference
  tokens), and stores its 9 full blocks in the KV server, signed;
- every block value is then replaced by what another writer of the KV server
  can make without the secret: other KV (zeros) under the same name, with
  the right namespace, key, length and CRC-32C, and no tag;
- server C, "unsigned": true, serves the prompt from those values: its
  tokens are not the reference (the attack this item closes, shown to
  work; without it the test below could pass on a server that never reads
  the KV server);
- the values are forged again; server B, signed with the fleet's secret,
  serves the prompt: every forged value is a counted miss (``unsigned``),
  none is restored, and its tokens equal A's L1 hit, exactly.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.disk_store import POOL_GIB, SMALL_L1, start
from tests.e2e.traffic import complete, metrics
from tools.harness.server import metric
from tools.harness.valkey_server import KvServer
from vllm_uma.kv_offload.disk.block_file import FIXED_HEADER, HEADER_BYTES
from vllm_uma.kv_offload.network.key_names import NAME_PREFIX
from vllm_uma.kv_offload.network.value_format import pack_value

pytestmark = pytest.mark.slow

FULL_BLOCKS = 9  # of the prompt (tests/e2e/traffic.py)
WRITTEN = "vllm:kv_offload_network_written_blocks_total"
READ = "vllm:kv_offload_network_read_blocks_total"
BAD = "vllm:kv_offload_network_bad_values_total"


def network_args(tier: dict) -> list[str]:
    config = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return [
        *SMALL_L1,
        *("--kv-offloading-size", str(POOL_GIB)),
        *("--kv-transfer-config", json.dumps(config)),
    ]


def forge_every_block(kv_server: KvServer) -> int:
    """Each block value under our prefix rewritten as an outsider could:
    zeros for KV, every field a reader checks without the secret right."""
    client, forged = kv_server.client(), 0
    for name in client.scan_iter(match=f"{NAME_PREFIX}*:{{*}}:*", count=1000):
        value = client.get(name)
        _, _, key_len, _, payload_bytes, namespace = FIXED_HEADER.unpack_from(value, 0)
        key = value[FIXED_HEADER.size : FIXED_HEADER.size + key_len]
        assert len(value) == HEADER_BYTES + payload_bytes
        client.set(name, pack_value(key, namespace, memoryview(bytes(payload_bytes)), keys=None))
        forged += 1
    return forged


@pytest.fixture(scope="module")
def runs(vllm_uma_exe, default_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("network-mac")
    kv_server = KvServer(work, "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru")
    signed = network_args(kv_server.tier())
    unsigned = network_args({"type": "valkey", "url": kv_server.url, "unsigned": True})
    out = {}
    try:
        a = start(vllm_uma_exe, signed, tmp_path_factory.mktemp("a"))
        try:
            complete(a, 0)
            out["reference"] = complete(a, 0)  # an L1 hit
            deadline = time.monotonic() + 60
            while metric(metrics(a), WRITTEN) < FULL_BLOCKS:
                assert time.monotonic() < deadline, "A's blocks never reached the KV server"
                time.sleep(0.2)
        finally:
            a.stop()
        out["forged_for_c"] = forge_every_block(kv_server)
        c = start(vllm_uma_exe, unsigned, tmp_path_factory.mktemp("c"))
        try:
            out["unsigned"] = complete(c, 0)
            out["unsigned_read"] = metric(metrics(c), READ)
        finally:
            c.stop()
        out["forged_for_b"] = forge_every_block(kv_server)
        b = start(vllm_uma_exe, signed, tmp_path_factory.mktemp("b"))
        try:
            out["signed"] = complete(b, 0)
            text = metrics(b)
            out["signed_read"] = metric(text, READ)
            out["signed_bad"] = metric(text, BAD, 'reason="unsigned"')
            out["b_log"] = b.log()
        finally:
            b.stop()
    finally:
        kv_server.stop()
    return out


def test_forged_kv_steers_a_server_that_does_not_check_tags(runs):
    assert runs["forged_for_c"] >= FULL_BLOCKS
    assert runs["unsigned_read"] >= FULL_BLOCKS  # it served the planted KV
    assert runs["unsigned"] != runs["reference"]


def test_a_signed_server_serves_no_forged_kv_and_answers_as_an_l1_hit(runs):
    assert runs["forged_for_b"] >= FULL_BLOCKS
    assert runs["signed_read"] == 0
    assert runs["signed_bad"] >= 1  # each forged value it met: a counted miss
    assert runs["signed"] == runs["reference"]
    assert "values signed with key id" in runs["b_log"]
