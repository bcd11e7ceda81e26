"""No KV server can stall or flood a server: the network tier against a KV server
that answers a byte at a time, one that answers a load with a 1 GiB value,
and one that holds the stores. A real valkey-server behind a proxy that
misbehaves on demand (kv_server_proxy.py); the tier starts through it honestly.
"""

from __future__ import annotations

import re
import time
import tracemalloc

import pytest
from kv_server_proxy import KvServerProxy, Mode
from network_tier_kit import answered_lookup, make_tier, started_kv_server, wait_for
from vllm.v1.kv_offload.base import LookupResult

from tests.unit.disk_tier_kit import CTX, NS, Jobs, Primary, counters, key
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network.value_format import value_name

TIMEOUT_S = 0.5
# What a thread needs beyond a deadline to see it and hand back its result.
SLACK_S = 0.3
LRU = ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")


@pytest.fixture(scope="module")
def kv_server(tmp_path_factory):
    kv_server = started_kv_server(tmp_path_factory.mktemp("valkey"), *LRU)
    yield kv_server
    kv_server.stop()


@pytest.fixture
def proxy(kv_server):
    kv_server.client().flushall()
    proxy = KvServerProxy(kv_server)
    yield proxy
    proxy.stop()


@pytest.fixture
def primary():
    return Primary()


@pytest.fixture
def tier(proxy, primary):
    tier = make_tier(proxy, primary, NS, timeout_s=TIMEOUT_S)
    yield tier
    tier.shutdown()


def stored(tier, primary, n: int) -> tuple[Jobs, list[bytes], list[bytes]]:
    """``n`` blocks stored through the honest proxy, and found by lookups."""
    jobs = Jobs(tier)
    keys = [key(i) for i in range(n)]
    data = [primary.fill(row, seed=row + 1) for row in range(n)]
    assert jobs.stored(keys, list(range(n))).success
    assert [answered_lookup(tier, k) for k in keys] == [LookupResult.HIT] * n
    primary.clear()
    return jobs, keys, data


def peak_rss_kib() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM back to the current RSS (proc(5))


def test_a_byte_at_a_time_kv_server_costs_a_load_its_timeout_then_a_miss(proxy, tier, primary):
    jobs, keys, data = stored(tier, primary, 2)
    proxy.mode = Mode.SLOW  # a value of 12 KiB would take 4 minutes
    start = time.monotonic()
    result = jobs.wait(jobs.load(keys, [4, 5]), timeout=TIMEOUT_S + 3)[0]
    assert time.monotonic() - start < TIMEOUT_S + SLACK_S
    assert not result.success and not result.successful_keys  # recomputed
    assert primary.row(4) == primary.row(5) == bytes(len(data[0]))  # no byte landed
    stats = counters(tier.get_stats())
    assert stats[(m.LOAD_MISSES, ("engine_slow",))] == 2
    proxy.mode = Mode.HONEST
    assert jobs.loaded(keys, [4, 5]).success  # the same KV server serves again
    assert [primary.row(4), primary.row(5)] == data


def test_a_store_to_a_byte_at_a_time_kv_server_ends_within_its_timeout(proxy, tier, primary):
    jobs = Jobs(tier)
    primary.fill(0, seed=1)
    proxy.byte_delay_s = 0.2  # every reply inside the old per-read timeout
    proxy.mode = Mode.SLOW
    start = time.monotonic()
    result = jobs.wait(jobs.store([key(0), key(1)], [0, 0]), timeout=TIMEOUT_S + 3)[0]
    assert time.monotonic() - start < TIMEOUT_S + SLACK_S
    assert not result.success
    assert not tier._link.up  # no whole answer in a timeout: down, lookups miss at once
    assert tier.lookup(key(0), CTX) is LookupResult.MISS
    proxy.mode = Mode.HONEST
    wait_for(lambda: tier._link.up, what="the KV server back up")
    assert jobs.stored([key(0)], [0]).success


def test_a_huge_value_is_refused_unread_and_deleted(kv_server, proxy, tier, primary):
    jobs, keys, data = stored(tier, primary, 2)
    proxy.mode = Mode.FLOOD  # a load's MGET answered with a 1 GiB value first
    tracemalloc.start()
    reset_peak_rss()
    before = peak_rss_kib()
    try:
        start = time.monotonic()
        result = jobs.wait(jobs.load(keys, [4, 5]), timeout=TIMEOUT_S + 30)[0]
        elapsed = time.monotonic() - start
        traced_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    grown_kib = peak_rss_kib() - before
    assert elapsed < TIMEOUT_S
    assert not result.success and not result.successful_keys  # recomputed
    assert traced_peak < 1 << 20, f"{traced_peak} bytes allocated during the load"
    assert grown_kib < 16 << 10, f"the peak RSS grew by {grown_kib} KiB"
    # Cut at its length: what left the proxy is what the kernel's buffers held.
    assert proxy.flood_sent < 64 << 20, f"{proxy.flood_sent} bytes of the value were taken"
    stats = counters(tier.get_stats())
    assert stats[(m.LOAD_MISSES, ("oversized",))] == 1
    assert stats[(m.NAMES.bad_values, ("oversized",))] == 1
    assert stats[(m.LOAD_MISSES, ("unread",))] == 1  # after it on the dropped connection
    # Never found again: deleted from the KV server (the real one held a good value).
    assert not kv_server.client().exists(value_name(NS, keys[0]))
    assert kv_server.client().exists(value_name(NS, keys[1]))
    assert tier._link.up  # a bad value is not the KV server gone
    proxy.mode = Mode.HONEST
    assert jobs.loaded([keys[1]], [5]).success and primary.row(5) == data[1]


def test_a_load_never_waits_behind_stores(proxy, tier, primary):
    jobs, keys, data = stored(tier, primary, 2)
    proxy.mode = Mode.HOLD_STORES  # every store is stuck on its socket now
    for i in range(2):
        jobs.store([key(10 + i)], [6])
    time.sleep(0.05)  # the stores are on their way
    start = time.monotonic()
    result = jobs.wait(jobs.load(keys, [4, 5]), timeout=TIMEOUT_S + 3)[0]
    assert time.monotonic() - start < TIMEOUT_S / 2
    assert result.success and [primary.row(4), primary.row(5)] == data
