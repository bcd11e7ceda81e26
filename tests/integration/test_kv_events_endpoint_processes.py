"""The private KV events socket (vllm_uma/commands/kv_events_endpoint.py) in
a server process of its own: its file goes when the process exits, a
planted file that is not a socket stays. The endpoint's rules:
tests/unit/test_kv_events_endpoint.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ON = ["--kv-events-config", json.dumps({"enable_kv_cache_events": True})]


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path / "cache"


def test_the_private_socket_file_goes_when_the_server_exits(cache_root, tmp_path):
    planted = tmp_path / "not-a-socket"
    planted.write_text("x")
    code = f"""
import json, zmq
from argparse import Namespace
from vllm.config.kv_events import KVEventsConfig
from vllm_uma.commands import kv_events_endpoint as kv
events = KVEventsConfig(enable_kv_cache_events=True)
kv.choose_endpoint(Namespace(kv_events_config=events, port=8124, uds=None), [])
sock = zmq.Context().socket(zmq.PUB)
sock.bind(events.endpoint)  # as vLLM's publisher does, which leaves the file
import atexit
atexit.register(kv.remove_socket_file, {str(planted)!r})  # not a socket: kept
print(events.endpoint, flush=True)
"""
    env = {**os.environ, "VLLM_UMA_CACHE_DIR": str(cache_root)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"ipc://{cache_root / 'run' / 'kv-events-8124.sock'}"
    assert not (cache_root / "run" / "kv-events-8124.sock").exists()
    assert planted.read_text() == "x"
