"""The network tier's KV server: killed mid-job, restarted, full, evicting, set
up wrong, behind an ACL. Each test starts its own valkey-server (killed at
its end), since each one breaks it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from network_tier_kit import answered_lookup, make_tier, started_kv_server, wait_for
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from tests.unit.disk_tier_kit import NS, InfoLog, Jobs, Primary, WarningLog, counters, key
from tests.unit.kv_secret_kit import signed
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network import server_link
from vllm_uma.kv_offload.network import tier as tier_module
from vllm_uma.kv_offload.network.server_check import ServerRefused

TIMEOUT_S = 0.5
LRU = ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")


@pytest.fixture
def start_kv_server(tmp_path):
    started = []

    def start(*args: str):
        kv_server = started_kv_server(tmp_path, *args)
        started.append(kv_server)
        return kv_server

    yield start
    for kv_server in started:
        kv_server.stop()


@pytest.fixture
def primary():
    return Primary()


def test_a_kv_server_killed_mid_load_fails_its_blocks_within_the_timeout_then_serves_again(
    start_kv_server, primary
):
    kv_server = start_kv_server(*LRU)
    tier = make_tier(kv_server, primary, NS, timeout_s=TIMEOUT_S)
    try:
        jobs = Jobs(tier)
        data = [primary.fill(r, seed=r) for r in range(4)]
        assert jobs.stored([key(i) for i in range(4)], [0, 1, 2, 3]).success
        with WarningLog(server_link.logger) as warned, InfoLog(server_link.logger) as info:
            kv_server.freeze()  # a load, a store and a lookup wait on sockets now...
            start = time.monotonic()
            job = jobs.load([key(i) for i in range(4)], [4, 5, 6, 7])
            other_job = jobs.store([key(8)], [0])
            assert tier.lookup(key(5), ReqContext(req_id="asks")) is LookupResult.RETRY
            tier.on_schedule_end(None)
            time.sleep(0.1)
            kv_server.stop()  # ...and the KV server dies under them
            result, stored = jobs.wait(job, other_job, timeout=TIMEOUT_S + 2.0)
            assert time.monotonic() - start < TIMEOUT_S + 1.0
            assert not result.success and not result.successful_keys
            assert not stored.success
            # Down: lookups are misses at once, stores fail without a round trip.
            assert tier.lookup(key(0), ReqContext(req_id="later")) is LookupResult.MISS
            assert not jobs.stored([key(9)], [0]).success
            assert not jobs.loaded([key(0)], [4]).success
            down = [line for line in warned.messages if "did not answer" in line]
            assert len(down) == 1  # one line for the episode, three threads failed in it
            kv_server.start()  # a new KV server on the same port: empty
            wait_for(lambda: tier._link.up, what="the link back up")
            assert any("answers again" in line for line in info.messages)
        assert jobs.stored([key(0)], [0]).success
        primary.clear()
        assert answered_lookup(tier, key(0), ReqContext(req_id="after")) is LookupResult.HIT
        assert jobs.loaded([key(0)], [7]).success and primary.row(7) == data[0]
        stats = counters(tier.get_stats())
        assert stats[(m.LOAD_MISSES, ("engine_down",))] == 5
        assert stats[(m.NAMES.store_failed, ("engine_down",))] == 2
    finally:
        tier.shutdown()


def test_a_frozen_kv_server_is_a_miss_after_the_timeout_not_a_hang(start_kv_server, primary):
    kv_server = start_kv_server(*LRU)
    tier = make_tier(kv_server, primary, NS, timeout_s=TIMEOUT_S)
    try:
        kv_server.freeze()
        start = time.monotonic()
        assert answered_lookup(tier, key(1)) is LookupResult.MISS
        assert time.monotonic() - start < TIMEOUT_S + 1.0
        assert not tier._link.up
    finally:
        kv_server.stop()
        tier.shutdown()


def test_noeviction_is_refused_at_start_up_with_the_fix(start_kv_server, primary):
    kv_server = start_kv_server("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
    with pytest.raises(ServerRefused, match="CONFIG SET maxmemory-policy allkeys-lru"):
        make_tier(kv_server, primary, NS)


def test_a_cluster_tier_on_a_kv_server_that_is_not_one_is_refused_with_the_fix(
    start_kv_server, primary
):
    kv_server = start_kv_server(*LRU)
    with pytest.raises(ServerRefused, match='remove "cluster": true'):
        make_tier(kv_server, primary, NS, cluster=True)


@pytest.mark.parametrize(
    "args, warning",
    [
        (("--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"), "evicts only keys"),
        (("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"), "has no maxmemory"),
    ],
)
def test_a_policy_that_keeps_our_keys_forever_is_warned_of(start_kv_server, primary, args, warning):
    kv_server = start_kv_server(*args)
    with WarningLog(tier_module.logger) as log:
        tier = make_tier(kv_server, primary, NS)
    tier.shutdown()
    assert len(log.messages) == 1 and warning in log.messages[0]
    assert "CONFIG SET maxmemory" in log.messages[0]


def test_an_acl_user_without_config_is_warned_of_and_served(start_kv_server, primary, monkeypatch):
    kv_server = start_kv_server(*LRU)
    kv_server.client().acl_setuser(
        "kv", enabled=True, passwords=["+pw-of-kv"], keys=["vllm-uma:*"],
        commands=["+@all", "-config"],
    )  # fmt: skip
    monkeypatch.setenv("TEST_KV_PASSWORD", "pw-of-kv")
    url = f"valkey://kv@127.0.0.1:{kv_server.port}/0"
    with WarningLog(tier_module.logger) as log:
        tier = make_tier(kv_server, primary, NS, url=url, password_env="TEST_KV_PASSWORD")
    try:
        assert (
            len(log.messages) == 1
            and "cannot read the KV server's maxmemory-policy" in log.messages[0]
        )
        assert "pw-of-kv" not in log.messages[0]
        data = primary.fill(0, seed=4)
        jobs = Jobs(tier)
        assert jobs.stored([key(1)], [0]).success
        assert jobs.loaded([key(1)], [1]).success and primary.row(1) == data
    finally:
        tier.shutdown()


def test_a_wrong_password_is_a_kv_server_that_does_not_answer(
    start_kv_server, primary, monkeypatch
):
    kv_server = start_kv_server(*LRU)
    kv_server.client().config_set("requirepass", "right")
    monkeypatch.setenv("TEST_KV_PASSWORD", "wrong")
    with WarningLog(server_link.logger) as log:
        tier = make_tier(kv_server, primary, NS, password_env="TEST_KV_PASSWORD")
    try:
        assert not tier._link.up and "did not answer" in log.messages[0]
        assert "wrong" not in log.messages[0].replace("wrong password", "")
    finally:
        tier.shutdown()


def test_a_small_kv_server_evicts_old_blocks_and_keeps_taking_stores(start_kv_server, primary):
    kv_server = start_kv_server("--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
    tier = make_tier(kv_server, primary, NS)
    try:
        jobs = Jobs(tier)
        for row in range(8):
            primary.fill(row, seed=row)
        # 400 values of 12 KiB: 4.8 MB into 3 MB.
        for first in range(0, 400, 8):
            assert jobs.stored([key(i) for i in range(first, first + 8)], list(range(8))).success
        assert kv_server.client().info("stats")["evicted_keys"] > 0
        ctx = ReqContext(req_id="scan")
        verdicts = [answered_lookup(tier, key(i), ctx) for i in range(400)]
        assert verdicts[-1] is LookupResult.HIT  # the newest stays
        assert LookupResult.MISS in verdicts[:100]  # the oldest went
    finally:
        tier.shutdown()


def test_a_full_kv_server_refuses_stores_once_per_episode_and_takes_them_again(
    start_kv_server, primary
):
    kv_server = start_kv_server(*LRU)
    tier = make_tier(kv_server, primary, NS)
    try:
        jobs = Jobs(tier)
        primary.fill(0, seed=1)
        client = kv_server.client()
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # below what it holds: every write is OOM
        with WarningLog(server_link.logger) as warned, InfoLog(server_link.logger) as info:
            assert not jobs.stored([key(1)], [0]).success
            assert not jobs.stored([key(2)], [0]).success
            assert len([w for w in warned.messages if "is full" in w]) == 1
            client.config_set("maxmemory", "64mb")
            assert jobs.stored([key(3)], [0]).success
            assert any("takes writes again" in line for line in info.messages)
        assert counters(tier.get_stats())[(m.NAMES.store_failed, ("engine_full",))] == 2
    finally:
        tier.shutdown()


def _tiered_spec(tmp_path, offload, context):
    """UmaTieredOffloadingSpec's scheduler side, without vLLM's __init__."""
    from types import SimpleNamespace

    from tests.unit.test_namespace_inputs import OFFLOADING
    from vllm_uma.kv_offload import spec

    model = tmp_path / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    built = spec.UmaTieredOffloadingSpec.__new__(spec.UmaTieredOffloadingSpec)
    built._offload = offload
    built._context = context
    built.config = SimpleNamespace(
        **{**vars(OFFLOADING), "model": SimpleNamespace(name=str(model), dtype="bfloat16")},
        engine_id="engine-network-spec",
    )
    built.num_chunks = 2
    built.eviction_policy = "lru"
    built.cache_policy_module_path = None
    built.kv_events_config = SimpleNamespace(enable_kv_cache_events=False)
    return built


def test_the_tiered_spec_builds_the_disk_tier_then_the_network_tier(
    start_kv_server, tmp_path, monkeypatch
):
    from vllm_uma.kv_offload.config import OffloadPlan
    from vllm_uma.kv_offload.disk.settings import DiskTierSettings
    from vllm_uma.kv_offload.network.settings import parse_network_tier
    from vllm_uma.kv_offload.pool_size import PoolSize
    from vllm_uma.plugin.engine_context import EngineContext

    kv_server = start_kv_server(*LRU)
    network = parse_network_tier(signed({"type": "valkey", "url": kv_server.url}))
    disk = DiskTierSettings(tmp_path / "kv", None, False, "test")
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(tmp_path / "cache"))
    context = EngineContext()
    context.host_pool.open(2, 8192)  # as the worker's mover does
    try:
        for disk_tier, types in ((disk, ["fs", "valkey"]), (None, ["valkey"])):
            pool = PoolSize(16384, "test")
            plan = OffloadPlan("UmaTieredOffloadingSpec", pool, disk_tier, None, (), network)
            built = _tiered_spec(tmp_path / types[0], plan, context)
            manager = built._build_manager()
            try:
                assert [t.tier_type for t in manager.secondary_tiers] == types
                # Pins live in the disk tier's ledger: kept alive in the KV server beside it only.
                assert (manager.secondary_tiers[-1]._pins is not None) == (disk_tier is not None)
            finally:
                manager.shutdown()
        # The network tier alone keeps the weights' fingerprint with the models.
        assert (tmp_path / "cache" / "fingerprints.json").is_file()
    finally:
        context.host_pool.release()


def test_a_kv_server_dies_with_the_test_that_started_it(tmp_path):
    # A test killed mid-way (SIGKILL: no fixture teardown) leaves no KV server.
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time; from pathlib import Path;"
        "from tools.harness.valkey_server import KvServer;"
        f"e = KvServer(Path({str(tmp_path)!r})); print(e.proc.pid, flush=True); time.sleep(60)"
    )
    root = str(Path(__file__).resolve().parents[2])
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    kv_server_pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    wait_for(lambda: not Path(f"/proc/{kv_server_pid}").exists(), 10, "the KV server to exit")


def test_a_check_that_keeps_failing_is_logged_once_per_failure(start_kv_server, caplog):
    # The watch tries a down node every retry interval; a KV server that
    # answers PING but keeps failing the check logs one traceback, and
    # another only when the failure changes.
    import logging

    import valkey

    from vllm_uma.kv_offload.network.settings import parse_network_tier

    kv_server = start_kv_server(*LRU)
    failures = iter(["NOPERM no permission"] * 3 + ["NOPERM other"] * 2 + [None])

    def refuse(node):
        failure = next(failures)
        if failure is not None:
            raise valkey.exceptions.ResponseError(failure)

    config = parse_network_tier(signed({"type": "valkey", "url": kv_server.url}))
    link = server_link.ServerLink(config, refuse, retry_interval_s=60)
    try:
        with caplog.at_level(logging.ERROR, logger=server_link.logger.name):
            answered = [link._answers(link.seed) for _ in range(5)]
        assert answered == [False] * 5
        said = [r for r in caplog.records if "checking the KV server" in r.getMessage()]
        assert len(said) == 2
        assert all(r.exc_info is not None for r in said)
        assert "no permission" in said[0].getMessage()
        assert "other" in said[1].getMessage()
        # Another action that succeeds on the node (a cluster's map read)
        # does not forget the failure; the check passing does.
        assert link._try_node(link.seed, lambda node: None)
        assert link.seed.check_failure == "ResponseError: NOPERM other"
        assert link._answers(link.seed)
        assert link.seed.check_failure is None
    finally:
        link.close()
