"""The network tier on a real Valkey Cluster (tools/harness/valkey_cluster.py:
three primaries on loopback, ``cluster-require-full-coverage no``): blocks
spread over the nodes, one round trip per node, a node killed under the
tier, every node's policy checked, a bad value on one node.

One cluster for the module (forming one takes two seconds: a primary waits
that long after its start before it says ok); a test that breaks a node
puts it back."""

from __future__ import annotations

import os
import signal
import time

import pytest
import valkey
from network_tier_kit import answered_lookup, make_tier, started_cluster, wait_for
from valkey.crc import key_slot
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from tests.unit.disk_tier_kit import NS, InfoLog, Jobs, Primary, WarningLog, counters, key
from vllm_uma.kv_offload.disk.block_file import HEADER_BYTES
from vllm_uma.kv_offload.network import metrics as m
from vllm_uma.kv_offload.network import server_link
from vllm_uma.kv_offload.network import tier as tier_module
from vllm_uma.kv_offload.network.key_names import descriptor_name
from vllm_uma.kv_offload.network.server_check import ServerRefused
from vllm_uma.kv_offload.network.value_format import value_name

TIMEOUT_S = 0.5
NODES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = started_cluster(tmp_path_factory.mktemp("cluster"), "--maxmemory", "64mb",
                              "--maxmemory-policy", "allkeys-lru")  # fmt: skip
    yield cluster
    cluster.stop()


@pytest.fixture
def clients(cluster):
    """One client per node, kept for the test: a new connection's handshake
    would count as reads of its own."""
    clients = [cluster.client(i) for i in range(NODES)]
    for client in clients:
        client.flushall()
    return clients


@pytest.fixture
def primary():
    return Primary()


@pytest.fixture
def tier(cluster, clients, primary):
    tier = make_tier(cluster, primary, NS, cluster=True, timeout_s=TIMEOUT_S)
    yield tier
    tier.shutdown()


def node_of(cluster, k: bytes) -> int:
    return cluster.node_of_slot(key_slot(value_name(NS, k)))


def spread_keys(cluster, count: int = 8) -> list[bytes]:
    """``count`` keys with at least two on every node."""
    chosen: list[bytes] = []
    per_node = [0] * NODES
    for i in range(1000):
        node = node_of(cluster, key(i))
        if per_node[node] < 2 or min(per_node) >= 2:
            chosen.append(key(i))
            per_node[node] += 1
        if len(chosen) == count:
            return chosen
    raise AssertionError("no spread of keys found")


def stored_rows(jobs: Jobs, primary: Primary, keys: list[bytes]) -> list[bytes]:
    data = [primary.fill(row, seed=row + 30) for row in range(len(keys))]
    assert jobs.stored(keys, list(range(len(keys)))).success
    return data


def test_blocks_land_on_every_node_and_come_back_byte_for_byte(cluster, clients, tier, primary):
    jobs = Jobs(tier)
    keys = [key(i) for i in range(24)]
    rows = [i % 8 for i in range(24)]
    data = [primary.fill(row, seed=row + 1) for row in range(8)]
    for first in range(0, 24, 8):
        assert jobs.stored(keys[first : first + 8], rows[first : first + 8]).success
    # Each value is on the node its slot says, and every node holds some.
    for k in keys:
        assert clients[node_of(cluster, k)].exists(value_name(NS, k)) == 1
    assert all(client.dbsize() > 0 for client in clients)
    assert sum(client.dbsize() for client in clients) == 24
    primary.clear()
    assert [answered_lookup(tier, k) for k in keys] == [LookupResult.HIT] * 24
    for first in range(0, 24, 8):
        primary.clear()
        result = jobs.loaded(keys[first : first + 8], list(range(8)))
        assert result.success
        assert [primary.row(r) for r in range(8)] == [data[rows[first + r]] for r in range(8)]
    stats = counters(tier.get_stats())
    assert stats[(m.NAMES.written_blocks, ())] == 24 and stats[(m.NAMES.read_blocks, ())] == 24


def _kv_server_counts(clients) -> list[tuple[int, int]]:
    """Per node: the reads it processed (one per round trip of small
    commands, this INFO's own included) and the MGETs it ran."""
    counts = []
    for client in clients:
        info = client.info("stats", "commandstats")
        counts.append((info["total_reads_processed"], info.get("cmdstat_mget", {}).get("calls", 0)))
    return counts


def test_a_load_batch_is_one_round_trip_per_node_with_one_mget_per_slot(
    cluster, clients, tier, primary
):
    jobs = Jobs(tier)
    # Two KV groups of one block share its hash tag, so its slot: one MGET.
    twin = key(0)[:-4] + (1).to_bytes(4, "big")
    keys = [*spread_keys(cluster, 7), twin]
    stored_rows(jobs, primary, keys)
    assert jobs.loaded(keys, list(range(8))).success  # every pooled connection is open now
    slots_per_node = [set() for _ in range(NODES)]
    for k in keys:
        slots_per_node[node_of(cluster, k)].add(key_slot(value_name(NS, k)))
    assert all(len(slots) >= 2 for slots in slots_per_node)
    before = _kv_server_counts(clients)
    primary.clear()
    assert jobs.loaded(keys, list(range(8))).success
    after = _kv_server_counts(clients)
    for node in range(NODES):
        reads = after[node][0] - before[node][0] - 1  # less the second INFO's own read
        mgets = after[node][1] - before[node][1]
        assert (reads, mgets) == (1, len(slots_per_node[node])), f"node {node}"
    assert sum(len(slots) for slots in slots_per_node) == 7  # the twins: one MGET
    # A lookup batch is one round trip per node too.
    ctx = ReqContext(req_id="batch")
    before = _kv_server_counts(clients)
    assert all(tier.lookup(k, ctx) is LookupResult.RETRY for k in keys)
    tier.on_schedule_end(None)  # the step's lookups go as one batch

    def answered() -> bool:
        tier.on_schedule_end(None)  # takes in the verdicts; asks nothing new
        return tier.lookup(keys[-1], ctx) is not LookupResult.RETRY

    wait_for(answered, what="the verdicts")
    after = _kv_server_counts(clients)
    assert [a[0] - b[0] - 1 for a, b in zip(after, before, strict=True)] == [1] * NODES
    assert all(tier.lookup(k, ctx) is LookupResult.HIT for k in keys)


def test_a_bad_value_on_one_node_is_a_counted_miss_and_the_rest_is_served(
    cluster, clients, tier, primary
):
    jobs = Jobs(tier)
    keys = spread_keys(cluster)
    data = stored_rows(jobs, primary, keys)
    # On a node other than the url's: its delete goes to its own node.
    bad = next(i for i, k in enumerate(keys) if node_of(cluster, k) != 0)
    name = value_name(NS, keys[bad])
    owner = clients[node_of(cluster, keys[bad])]
    owner.setrange(name, HEADER_BYTES + 100, bytes([data[bad][100] ^ 0x01]))
    primary.clear()
    with WarningLog(tier_module.logger) as log:
        result = jobs.loaded(keys, list(range(8)))
    assert not result.success
    assert list(result.successful_keys) == keys[:bad] + keys[bad + 1 :]
    assert primary.row(bad) == bytes(len(data[bad]))  # nothing of it lands in its row
    served = [r for r in range(8) if r != bad]
    assert [primary.row(r) for r in served] == [data[r] for r in served]
    stats = counters(tier.get_stats())
    assert stats[(m.NAMES.bad_values, ("corrupted",))] == 1
    assert stats[(m.LOAD_MISSES, ("corrupted",))] == 1
    assert owner.exists(name) == 0  # deleted on its own node
    assert len(log.messages) == 1 and "corrupted" in log.messages[0]


def test_a_killed_node_misses_its_slots_only_and_the_tier_serves_the_others(
    cluster, clients, tier, primary
):
    jobs = Jobs(tier)
    keys = spread_keys(cluster)
    data = stored_rows(jobs, primary, keys)
    dead = 0  # the url's node too: the map is read from the others meanwhile
    lost = [k for k in keys if node_of(cluster, k) == dead]
    kept = [k for k in keys if node_of(cluster, k) != dead]
    late = None
    with WarningLog(server_link.logger) as warned, InfoLog(server_link.logger) as info:
        cluster.nodes[dead].stop()
        try:
            for _ in range(2):  # the first finds it gone, the second fails it at once
                primary.clear()
                start = time.monotonic()
                result = jobs.loaded(keys, list(range(8)))
                assert time.monotonic() - start < TIMEOUT_S + 1.0
                assert set(result.successful_keys) == set(kept)
                for k in kept:
                    assert primary.row(keys.index(k)) == data[keys.index(k)]
            down = [line for line in warned.messages if "did not answer" in line]
            assert len(down) == 1 and f":{cluster.nodes[dead].port}/" in down[0]
            assert tier._link.up  # the other nodes answer
            ctx = ReqContext(req_id="after the kill")
            assert [answered_lookup(tier, k, ctx) for k in keys] == [
                LookupResult.MISS if k in lost else LookupResult.HIT for k in keys
            ]
            # Once the others flag it as failed, they keep serving their slots
            # (cluster-require-full-coverage no).
            survivor = clients[(dead + 1) % NODES]
            wait_for(lambda: survivor.cluster("INFO")["cluster_nodes_fail"] == "1", what="flagged")
            assert survivor.cluster("INFO")["cluster_state"] == "ok"
            primary.clear()
            assert set(jobs.loaded(keys, list(range(8))).successful_keys) == set(kept)
            # A server started now, with the dead node in its url, serves
            # without the cluster until that node answers.
            late = make_tier(cluster, primary, NS, cluster=True, timeout_s=TIMEOUT_S)
            assert not late._link.up and "map is not read yet" in warned.messages[-1]
            assert not Jobs(late).loaded(kept, list(range(len(kept)))).success
        finally:  # the next tests share the cluster
            cluster.nodes[dead].start()  # empty, with its slots (its nodes.conf)
            cluster.wait_ready()
        wait_for(lambda: all(node.up for node in tier._link.primaries), what="the node back")
        assert any("answers again" in line for line in info.messages)
        wait_for(lambda: len(late._link.primaries) == NODES and late._link.up, what="the map")
    try:
        primary.clear()
        assert Jobs(late).loaded(kept, list(range(len(kept)))).success
        assert [primary.row(r) for r in range(len(kept))] == [data[keys.index(k)] for k in kept]
    finally:
        late.shutdown()
    stats = counters(tier.get_stats())
    assert stats[(m.LOAD_MISSES, ("engine_down",))] == 3 * len(lost)
    assert jobs.stored(lost, [0] * len(lost)).success
    assert jobs.loaded(lost, list(range(len(lost)))).success


def test_frozen_nodes_are_misses_of_their_slots_after_one_timeout_not_one_each(
    cluster, clients, tier, primary
):
    jobs = Jobs(tier)
    keys = spread_keys(cluster)
    stored_rows(jobs, primary, keys)
    frozen = (1, 2)
    kept = [k for k in keys if node_of(cluster, k) not in frozen]
    for i in frozen:
        cluster.nodes[i].freeze()
    try:
        start = time.monotonic()
        result = jobs.loaded(keys, list(range(8)))
        # One deadline for every node's replies: about one timeout, not two.
        assert time.monotonic() - start < 1.6 * TIMEOUT_S
        assert set(result.successful_keys) == set(kept)
    finally:
        for i in frozen:
            os.kill(cluster.nodes[i].proc.pid, signal.SIGCONT)
    wait_for(lambda: all(node.up for node in tier._link.primaries), what="the nodes back")
    cluster.wait_ready()
    assert jobs.loaded(keys, list(range(8))).success


def _owner_port(client, slot: int) -> int:
    for first, last, (_, port, *_rest), *_replicas in client.execute_command("CLUSTER SLOTS"):
        if first <= slot <= last:
            return port
    return 0


def _give_slot(cluster, clients, slot: int, to: int) -> None:
    """Move an empty ``slot`` to node ``to``, on every node, and wait until
    every node says so."""
    node_id = clients[to].execute_command("CLUSTER MYID")
    for client in clients:
        client.execute_command("CLUSTER SETSLOT", slot, "NODE", node_id)
    port = cluster.nodes[to].port
    wait_for(lambda: all(_owner_port(c, slot) == port for c in clients), what="the slot moved")


def test_a_moved_slot_is_a_counted_miss_until_the_map_is_read_again(
    cluster, clients, tier, primary
):
    jobs = Jobs(tier)
    k = next(key(i) for i in range(100) if node_of(cluster, key(i)) == 1)
    name, slot = value_name(NS, k), key_slot(value_name(NS, k))
    data = primary.fill(0, seed=8)
    _give_slot(cluster, clients, slot, to=2)  # the tier's map still says node 1
    try:
        with WarningLog(tier_module.logger) as log:
            assert not jobs.stored([k], [0]).success  # node 1 answers MOVED
        assert counters(tier.get_stats())[(m.NAMES.store_failed, ("moved",))] == 1
        assert log.messages == []  # the cluster's state, not a fault: counted only
        to_port = cluster.nodes[2].port
        wait_for(lambda: [n.port for n in tier._link.route([name])] == [to_port], what="the map")
        assert jobs.stored([k], [0]).success
        assert clients[2].exists(name) == 1
        primary.clear()
        assert jobs.loaded([k], [5]).success and primary.row(5) == data
    finally:
        clients[2].delete(name)  # the slot must be empty to move back
        _give_slot(cluster, clients, slot, to=1)


def test_every_primary_s_policy_is_checked(cluster, clients, primary):
    try:
        clients[2].config_set("maxmemory-policy", "noeviction")
        with pytest.raises(ServerRefused) as refused:
            make_tier(cluster, primary, NS, cluster=True)
        assert f":{cluster.nodes[2].port}/0 runs maxmemory-policy noeviction" in str(refused.value)
        clients[2].config_set("maxmemory-policy", "allkeys-lru")
        clients[1].config_set("maxmemory-policy", "volatile-lru")
        clients[0].config_set("cluster-require-full-coverage", "yes")
        info_of_ns = {"model": "test-model", "kv_dtype": "bfloat16"}
        with WarningLog(tier_module.logger) as log, InfoLog(tier_module.logger) as info:
            make_tier(cluster, primary, NS, cluster=True, namespace_info=info_of_ns).shutdown()
        (warning,) = log.messages
        # The start-up line adds the three primaries' caps up: 3 x 64 MB,
        # and counts no blocks (one node's count over all the caps would
        # understate the share).
        (line,) = [x for x in info.messages if "cluster of 3 primaries, maxmemory 0.19 GiB" in x]
        assert "its blocks not counted on a cluster" in line

        # The namespace's descriptor is on the node of its slot, not lost to MOVED.
        def holds_descriptor(client) -> bool:
            try:
                return bool(client.exists(descriptor_name(NS)))
            except valkey.exceptions.ResponseError:  # MOVED: not this node's slot
                return False

        assert sum(holds_descriptor(c) for c in clients) == 1
        assert f":{cluster.nodes[1].port}/0 runs maxmemory-policy volatile-lru" in warning
        assert f"127.0.0.1:{cluster.nodes[0].port} run cluster-require-full-coverage" in warning
        assert "CONFIG SET cluster-require-full-coverage no" in warning
    finally:
        for client in clients:
            client.config_set("maxmemory-policy", "allkeys-lru")
            client.config_set("cluster-require-full-coverage", "no")


def test_a_tier_not_told_it_is_a_cluster_is_refused_with_the_fix(cluster, primary):
    with pytest.raises(ServerRefused, match='add "cluster": true'):
        make_tier(cluster, primary, NS)


def test_a_database_the_cluster_does_not_have_is_refused_with_the_fix(cluster, primary):
    url = cluster.url.removesuffix("/0") + "/1"
    with pytest.raises(ServerRefused, match="refused database 1 .* use /0 in the url"):
        make_tier(cluster, primary, NS, cluster=True, url=url)


def test_the_cluster_dies_with_the_test_that_started_it(tmp_path):
    # A test killed mid-way (SIGKILL: no fixture teardown) leaves no node.
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import time; from pathlib import Path;"
        "from tools.harness.valkey_cluster import Cluster;"
        f"c = Cluster(Path({str(tmp_path)!r}));"
        "print(*[n.proc.pid for n in c.nodes], flush=True); time.sleep(60)"
    )
    root = str(Path(__file__).resolve().parents[2])
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == NODES
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    for pid in pids:
        wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 10, "the node to exit")


def test_kv_store_refuses_a_cluster_node_with_the_reason(cluster, capsys):
    # One node's SCAN would list a part of our keys, and a delete of several
    # would be refused across slots: refused, nothing deleted.
    from vllm_uma.commands import main as cli

    for command in (["ls"], ["clear", "--yes"]):
        assert cli.main(["kv-store", cluster.url, *command]) == 2
        err = capsys.readouterr().err
        assert "is a node of a Valkey/Redis Cluster" in err and "valkey-cli --cluster" in err
