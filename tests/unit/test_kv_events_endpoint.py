"""KV events private by default (vllm_uma/commands/kv_events_endpoint.py):
without an endpoint, `vllm-uma serve` publishes on an ipc:// socket in a
0700 directory of this user's; a named endpoint is kept, and an open one
is named in a warning; a planted directory is refused. The socket is
bound by vLLM's real ZMQ publisher and read by a real subscriber. A
directory another user owns (as root), and the socket file at a server's
exit: tests/integration/test_kv_events_endpoint_root.py and
test_kv_events_endpoint_processes.py."""

from __future__ import annotations

import json
import os
import stat
import time
from argparse import Namespace

import pytest
import zmq
from vllm.config.kv_events import KVEventsConfig

from vllm_uma.commands import kv_events_endpoint as kv
from vllm_uma.commands.preflight import PreflightError

ON = ["--kv-events-config", json.dumps({"enable_kv_cache_events": True})]


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path / "cache"


@pytest.fixture()
def warnings(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(kv.logger, "warning", lambda fmt, *a: said.append(fmt % a))
    return said


def args_for(events: KVEventsConfig | None, port: int = 8123) -> Namespace:
    return Namespace(kv_events_config=events, port=port, uds=None)


@pytest.mark.parametrize(
    "argv, named",
    [
        (ON, False),
        (["--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "x"}'], True),
        (['--kv-events-config={"endpoint": "tcp://*:5557"}'], True),
        (["--kv-events-config.endpoint", "tcp://*:5557"], True),
        (["--kv-events-config.endpoint=tcp://*:5557"], True),
        (["--kv-events-config", "not json"], False),
        ([], False),
    ],
)
def test_whether_the_user_named_an_endpoint(argv, named):
    assert kv.endpoint_given(argv) is named


@pytest.mark.parametrize(
    "endpoint, who",
    [
        ("ipc:///run/x.sock", None),
        ("tcp://127.0.0.1:5557", "every user of this machine"),
        ("tcp://[::1]:5557", "every user of this machine"),
        ("tcp://*:5557", "any host that can reach this machine"),
        ("tcp://10.0.0.2:5557", "any host that can reach this machine"),
    ],
)
def test_who_can_reach_an_endpoint(endpoint, who):
    assert kv.reach(endpoint) == who


def test_the_default_becomes_a_private_socket_that_vllms_publisher_binds(cache_root):
    from vllm.distributed.kv_events import AllBlocksCleared, EventPublisherFactory, KVEventBatch

    events = KVEventsConfig(enable_kv_cache_events=True)
    assert events.endpoint == "tcp://*:5557"  # vLLM's default: any host
    kv.choose_endpoint(args_for(events), ON)
    path = cache_root / "run" / "kv-events-8123.sock"
    assert events.endpoint == f"ipc://{path}"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    publisher = EventPublisherFactory.create(events)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.connect(events.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        deadline = time.monotonic() + 10
        while not sub.poll(100):  # a PUB drops what it sends before SUB joins
            assert time.monotonic() < deadline, "nothing arrived on the private socket"
            publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))
        assert sub.recv_multipart()
    finally:
        sub.close(linger=0)
        publisher.shutdown()
        ctx.term()


def test_a_named_endpoint_is_kept_and_an_open_one_is_named(warnings):
    events = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:5557")
    kv.choose_endpoint(args_for(events), ["--kv-events-config.endpoint", "tcp://*:5557"])
    assert events.endpoint == "tcp://*:5557"
    assert len(warnings) == 1
    assert "tcp://*:5557 is reachable by any host that can reach this machine" in warnings[0]


def test_an_open_replay_endpoint_is_named_too(warnings):
    events = KVEventsConfig(enable_kv_cache_events=True, replay_endpoint="tcp://*:5558")
    kv.choose_endpoint(args_for(events), ON)
    assert events.endpoint.startswith("ipc://")
    assert ["replay_endpoint tcp://*:5558" in w for w in warnings] == [True]


def test_events_off_change_nothing(warnings):
    events = KVEventsConfig(enable_kv_cache_events=False)
    kv.choose_endpoint(args_for(events), [])
    kv.choose_endpoint(args_for(None), [])
    assert events.endpoint == "tcp://*:5557" and warnings == []


@pytest.mark.parametrize("planted", ["open", "symlink"])
def test_a_planted_directory_is_refused_with_the_fix(cache_root, tmp_path, planted):
    run = cache_root / "run"
    cache_root.mkdir(parents=True)
    if planted == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        run.symlink_to(tmp_path / "elsewhere")
    else:
        run.mkdir(mode=0o700)
        run.chmod(0o777)
    events = KVEventsConfig(enable_kv_cache_events=True)
    with pytest.raises(PreflightError) as err:
        kv.choose_endpoint(args_for(events), ON)
    message = str(err.value)
    assert message.startswith(f"{run} is ")
    assert {"open": "open to other users", "symlink": "a symbolic link"}[planted] in message
    assert "--kv-events-config.endpoint" in message
    assert events.endpoint == "tcp://*:5557"  # nothing half-done


def test_a_socket_path_too_long_for_unix_is_refused(cache_root, monkeypatch):
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(cache_root / ("d" * 120)))
    with pytest.raises(PreflightError, match="over the 107 a Unix socket allows"):
        kv.choose_endpoint(args_for(KVEventsConfig(enable_kv_cache_events=True)), ON)
