"""`vllm-uma kv-store URL ls|du|clear` on a real KV server the real tier wrote,
shared with another application's keys, which must survive every clear.
What it refuses before it connects, and which names are ours:
tests/unit/test_kv_store_network_names.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from network_tier_kit import answered_lookup, make_tier, started_kv_server
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from tests.unit.disk_tier_kit import NS, OTHER_NS, Jobs, Primary, key
from vllm_uma.commands import main as cli
from vllm_uma.kv_offload.network.key_names import descriptor_name
from vllm_uma.kv_offload.network.value_format import value_name

MAXMEMORY = 4 << 20
LRU = ("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "allkeys-lru")
INFO = {
    NS: {
        "model": "org/model-one",
        "kv_dtype": "bfloat16",
        "server": {"vllm": "0.x", "revision": None},
        "groups": [{"layers": ["not kept"]}],
    },
    OTHER_NS: {"model": "org/model-two", "kv_dtype": "float16"},
}
BLOCKS = {NS: [0, 1, 2], OTHER_NS: [5, 6]}
# Other applications' keys, some under our prefix but of no shape we write.
FOREIGN = [
    b"app:session:1",
    b"vllm-uma:kv:notours",
    f"vllm-uma:kv:{NS.hex()}:foreign".encode(),
    f"vllm-uma:kv:{NS.hex()}:{{zz}}:0".encode(),
]


@pytest.fixture(scope="module")
def kv_server(tmp_path_factory):
    kv_server = started_kv_server(tmp_path_factory.mktemp("valkey"), *LRU)
    yield kv_server
    kv_server.stop()


@pytest.fixture
def start_kv_server(tmp_path):
    started = []

    def start(*args: str):
        started.append(started_kv_server(tmp_path, *args))
        return started[-1]

    yield start
    for kv_server in started:
        kv_server.stop()


def store(kv_server, primary: Primary, ns: bytes) -> None:
    tier = make_tier(kv_server, primary, ns, namespace_info=INFO[ns])
    try:
        keys = BLOCKS[ns]
        for row, k in enumerate(keys):
            primary.fill(row, seed=k + 1)
        assert Jobs(tier).stored([key(k) for k in keys], list(range(len(keys)))).success
    finally:
        tier.shutdown()


@pytest.fixture
def kv_server_with_two(kv_server):
    """Two namespaces written by the tier, and the foreign keys."""
    client = kv_server.client()
    client.flushall()
    primary = Primary()
    for ns in BLOCKS:
        store(kv_server, primary, ns)
    for name in FOREIGN:
        client.set(name, b"theirs")
    return kv_server


def run(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main(["kv-store", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def names_of(kv_server, ns: bytes) -> list[bytes]:
    return [value_name(ns, key(k)) for k in BLOCKS[ns]] + [descriptor_name(ns)]


def memory(kv_server, ns: bytes) -> int:
    client = kv_server.client()
    return sum(client.memory_usage(name) for name in names_of(kv_server, ns)[:-1])


def test_ls_lists_each_namespace_with_model_dtype_blocks_size_and_share(kv_server_with_two, capsys):
    status, out, err = run(capsys, kv_server_with_two.url, "ls")
    assert status == 0 and err == ""
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:-1]}
    assert set(rows) == {NS.hex(), OTHER_NS.hex()}  # the foreign keys are no namespace
    for ns, model, dtype in (
        (NS, "org/model-one", "bfloat16"),
        (OTHER_NS, "org/model-two", "float16"),
    ):
        row = rows[ns.hex()]
        assert row[1:4] == [model, dtype, str(len(BLOCKS[ns]))]
        assert row[6] == f"{memory(kv_server_with_two, ns) / MAXMEMORY:.1%}"
    total = memory(kv_server_with_two, NS) + memory(kv_server_with_two, OTHER_NS)
    assert out.splitlines()[-1].endswith(f"{total / MAXMEMORY:.1%} of maxmemory")
    assert "policy allkeys-lru" in out.splitlines()[-1]


def test_du_gives_bytes_per_namespace_and_the_total(kv_server_with_two, capsys):
    status, out, _ = run(capsys, kv_server_with_two.url, "du")
    assert status == 0
    lines = out.splitlines()
    assert NS.hex() in lines[0] and OTHER_NS.hex() in lines[1]  # the largest first
    share = memory(kv_server_with_two, NS) / MAXMEMORY
    assert lines[0].endswith(f"org/model-one  ({share:.1%} of maxmemory)")
    assert lines[2].split()[2:] == ["total,", "5", "blocks"]


def test_clear_of_one_namespace_leaves_the_other_and_every_foreign_key(kv_server_with_two, capsys):
    status, out, _ = run(capsys, kv_server_with_two.url, "clear", "--namespace", NS.hex(), "--yes")
    assert status == 0
    assert out.startswith(f"deleted 4 keys of namespace {NS.hex()}")  # 3 blocks, descriptor
    client = kv_server_with_two.client()
    assert client.exists(*names_of(kv_server_with_two, NS)) == 0
    assert client.exists(*names_of(kv_server_with_two, OTHER_NS)) == 3
    assert client.exists(*FOREIGN) == len(FOREIGN)


def test_clear_of_all_ours_leaves_every_foreign_key(kv_server_with_two, capsys):
    status, out, _ = run(capsys, kv_server_with_two.url, "clear", "--yes")
    assert status == 0 and out.startswith("deleted 7 keys of every namespace of ours")
    client = kv_server_with_two.client()
    assert sorted(client.keys()) == sorted(FOREIGN)
    status, out, _ = run(capsys, kv_server_with_two.url, "ls")
    assert status == 0 and "(no namespaces)" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["clear"], "add --yes"),
        (["clear", "--namespace", NS.hex()], "add --yes"),
        (["clear", "--namespace", "11", "--yes"], "is not a namespace id: it is 32 hex digits"),
    ],
)
def test_a_clear_that_is_not_meant_deletes_nothing_and_exits_2(
    kv_server_with_two, capsys, argv, message
):
    before = len(kv_server_with_two.client().keys())
    status, _, err = run(capsys, kv_server_with_two.url, *argv)
    assert status == 2 and message in err
    assert len(kv_server_with_two.client().keys()) == before


def test_a_clear_under_a_running_server_is_a_miss_then_a_store_again(kv_server, capsys):
    kv_server.client().flushall()
    primary = Primary()
    tier = make_tier(kv_server, primary, NS, namespace_info=INFO[NS])
    try:
        jobs = Jobs(tier)
        primary.fill(0, seed=3)
        assert jobs.stored([key(0)], [0]).success
        before = ReqContext(req_id="before")
        assert answered_lookup(tier, key(0), before) is LookupResult.HIT
        tier.on_request_finished(before)  # its verdict lasts as long as the request
        assert run(capsys, kv_server.url, "clear", "--namespace", NS.hex(), "--yes")[0] == 0
        assert answered_lookup(tier, key(0), ReqContext(req_id="after")) is LookupResult.MISS
        assert not jobs.loaded([key(0)], [1]).success  # a load that raced it: a miss
        assert jobs.stored([key(1)], [0]).success  # and the tier goes on storing
    finally:
        tier.shutdown()


def test_a_survey_leaves_the_kv_servers_eviction_order_alone(start_kv_server, capsys):
    # Under allkeys-lfu a read of a fresh key raises its counter (5 to 6) for
    # sure: MEMORY USAGE must not read it the way STRLEN or GET would.
    kv_server = start_kv_server("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lfu")
    primary = Primary()
    store(kv_server, primary, NS)
    client = kv_server.client()
    names = names_of(kv_server, NS)[:-1]
    before = [client.object("freq", name) for name in names]
    assert run(capsys, kv_server.url, "ls")[0] == 0
    assert run(capsys, kv_server.url, "du")[0] == 0
    assert [client.object("freq", name) for name in names] == before
    client.get(names[0])  # the test would see a read
    assert client.object("freq", names[0]) > before[0]


def test_a_kv_server_that_does_not_answer_exits_3_naming_the_address(start_kv_server, capsys):
    kv_server = start_kv_server(*LRU)
    kv_server.stop()
    status, _, err = run(capsys, kv_server.url, "ls")
    assert status == 3
    assert f"the KV server at {kv_server.url} does not answer" in err
    assert f"check that it runs and that 127.0.0.1:{kv_server.port} is its address" in err


def test_a_frozen_kv_server_exits_3_within_the_timeout(start_kv_server, capsys):
    kv_server = start_kv_server(*LRU)
    kv_server.freeze()
    status, _, err = run(capsys, kv_server.url, "du", "--timeout-s", "0.3")
    assert status == 3 and "did not answer within 0.3 s" in err and "--timeout-s" in err


def test_a_password_missing_or_wrong_exits_3_with_the_fix(start_kv_server, capsys, monkeypatch):
    kv_server = start_kv_server(*LRU)
    kv_server.client().config_set("requirepass", "right")
    status, _, err = run(capsys, kv_server.url, "ls")
    assert status == 3 and "asks for a password" in err and "--password-env NAME" in err
    monkeypatch.setenv("TEST_KV_PASSWORD", "wrong")
    status, _, err = run(capsys, kv_server.url, "ls", "--password-env", "TEST_KV_PASSWORD")
    assert status == 3 and "refused the password" in err
    assert "the variable TEST_KV_PASSWORD" in err
    monkeypatch.setenv("TEST_KV_PASSWORD", "right")
    assert run(capsys, kv_server.url, "ls", "--password-env", "TEST_KV_PASSWORD")[0] == 0


def test_an_acl_that_forbids_a_command_exits_3_naming_what_it_needs(
    start_kv_server, capsys, monkeypatch
):
    kv_server = start_kv_server(*LRU)
    kv_server.client().acl_setuser(
        "kv", enabled=True, passwords=["+pw-of-kv"], keys=["vllm-uma:*"],
        commands=["+@all", "-unlink"],
    )  # fmt: skip
    kv_server.client().set(value_name(NS, key(0)), b"x")
    monkeypatch.setenv("TEST_KV_PASSWORD", "pw-of-kv")
    url = f"valkey://kv@127.0.0.1:{kv_server.port}/0"
    status, _, err = run(capsys, url, "clear", "--yes", "--password-env", "TEST_KV_PASSWORD")
    assert status == 3 and "refused a command" in err and "+unlink" in err
    assert "pw-of-kv" not in err


def test_the_tier_writes_its_descriptor_without_what_is_not_kept(kv_server_with_two):
    descriptor = json.loads(kv_server_with_two.client().get(descriptor_name(NS)))
    assert descriptor == {"model": "org/model-one", "kv_dtype": "bfloat16", "vllm": "0.x"}


def test_the_command_does_not_import_vllm():
    # vLLM's import costs seconds; the disk store's command does without it too.
    script = (
        "import sys; from vllm_uma.commands import main;"
        "status = main.main(['kv-store', 'valkey://127.0.0.1:1/0', 'ls', '--timeout-s', '0.5']);"
        "print(status, 'vllm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.split() == ["3", "False"], done.stderr
