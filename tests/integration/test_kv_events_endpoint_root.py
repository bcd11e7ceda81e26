"""The private KV events socket's directory (vllm_uma/commands/kv_events_endpoint.py)
planted by another user, made so as root: refused with the fix. The other
planted directories: tests/unit/test_kv_events_endpoint.py."""

from __future__ import annotations

import json
import os
from argparse import Namespace

import pytest
from vllm.config.kv_events import KVEventsConfig

from vllm_uma.commands import kv_events_endpoint as kv
from vllm_uma.commands.preflight import PreflightError

ON = ["--kv-events-config", json.dumps({"enable_kv_cache_events": True})]


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path / "cache"


def args_for(events: KVEventsConfig | None, port: int = 8123) -> Namespace:
    return Namespace(kv_events_config=events, port=port, uds=None)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_directory_another_user_owns_is_refused_with_the_fix(cache_root):
    run = cache_root / "run"
    cache_root.mkdir(parents=True)
    run.mkdir(mode=0o700)
    os.chown(run, 65534, 65534)
    events = KVEventsConfig(enable_kv_cache_events=True)
    with pytest.raises(PreflightError) as err:
        kv.choose_endpoint(args_for(events), ON)
    message = str(err.value)
    assert message.startswith(f"{run} is ") and "owned by" in message
    assert "--kv-events-config.endpoint" in message
    assert events.endpoint == "tcp://*:5557"  # nothing half-done
