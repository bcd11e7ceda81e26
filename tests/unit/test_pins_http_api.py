"""The pins API's routes (vllm_uma/kv_offload/pins/http_api.py) on a small
Starlette app: the real middleware, the real ledger in a temp store, vLLM's
real API-key middleware; the engine is a stand-in route answering what the
connector reports (the real engine: tests/e2e/test_pins.py)."""

from __future__ import annotations

import argparse
import sqlite3
import types

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from vllm_uma.kv_offload.config import OffloadPlan
from vllm_uma.kv_offload.disk.layout import NOINDEX
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.http_api import PinRoutes
from vllm_uma.kv_offload.pins.metrics import WARM_UP_HEADER
from vllm_uma.kv_offload.pool_size import PoolSize
from vllm_uma.plugin import settings_plan
from vllm_uma.plugin.uma_settings import UmaSettings

NS = "11" * 16
BLOCK = 1000


def engine_reply(text: str, blocks: int) -> dict:
    """What vLLM answers a pinning request, the connector's part included."""
    keys = [f"{i:04x}" + text[:8].encode().hex() for i in range(blocks)]
    return {
        "usage": {"prompt_tokens": 32 * blocks + 5},
        "kv_transfer_params": {
            "vllm_uma_pin": {
                "namespace": NS,
                "keys": keys,
                "block_bytes": BLOCK,
                "pool_rows": 100,
                "tokens": 32 * blocks + 5,
            }
        },
    }


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "kv"
    (root / NOINDEX).mkdir(parents=True)
    ledger = Ledger(root / NOINDEX)
    ledger.create()
    yield root, ledger
    ledger.close()


def client_for(root, monkeypatch, api_key=None, cap=100 * BLOCK, seen=None, registry=None):
    seen = [] if seen is None else seen

    async def completions(request: Request):
        body = await request.json()
        seen.append((request.url.path, body))
        if body.get("prompt") == "too long":
            return JSONResponse({"error": {"message": "too long", "code": 400}}, 400)
        text = body.get("prompt") or str(body.get("messages"))
        return JSONResponse(engine_reply(str(text), blocks=len(str(text)) // 10))

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
        ]
    )
    disk = DiskTierSettings(root_dir=root, cap_bytes=cap, enable_kv_events=False, cap_reason="t")
    plan = settings_plan.SettingsPlan(
        uma=UmaSettings(),
        offload=OffloadPlan("tiered", PoolSize(1 << 20, "t"), disk, None, ()),
    )
    config = types.SimpleNamespace(additional_config={})
    settings_plan.attach(config, plan)
    monkeypatch.setenv(settings_plan.PLAN_ENV, settings_plan.dumps(plan))
    app.state.vllm_config = config
    app.state.args = argparse.Namespace(
        api_key=None if api_key is None else [api_key], served_model_name=["m"], model="/m"
    )
    app.add_middleware(PinRoutes, registry=registry or CollectorRegistry())
    return TestClient(app), seen


def test_a_pin_runs_the_prompt_through_vllm_and_lands_in_the_ledger(store, monkeypatch):
    root, ledger = store
    client, seen = client_for(root, monkeypatch)
    reply = client.post("/v1/uma/pins", json={"name": "sys", "prompt": "x" * 50, "ttl_s": 60})
    assert reply.status_code == 200, reply.text
    assert reply.json()["blocks"] == 5 and reply.json()["bytes"] == 5 * BLOCK
    path, body = seen[0]
    assert path == "/v1/completions" and body["max_tokens"] == 1
    assert body["kv_transfer_params"] == {"vllm_uma_pin": True} and body["model"] == "m"
    (pin,) = book.pins(ledger)
    assert pin.name == "sys" and pin.namespace.hex() == NS
    listed = client.get("/v1/uma/pins").json()
    assert [p["name"] for p in listed["pins"]] == ["sys"] and listed["disk_budget_bytes"] == 50_000
    chat = client.post("/v1/uma/pins", json={"name": "c", "messages": [{"role": "system"}]})
    assert chat.status_code == 200 and seen[-1][0] == "/v1/chat/completions"
    assert client.delete("/v1/uma/pins/c").status_code == 200
    assert client.delete("/v1/uma/pins/c").status_code == 404


def test_a_pin_over_budget_is_409_with_the_numbers(store, monkeypatch):
    root, ledger = store
    registry = CollectorRegistry()
    client, _ = client_for(root, monkeypatch, cap=10 * BLOCK, registry=registry)  # 5 blocks
    assert client.post("/v1/uma/pins", json={"name": "a", "prompt": "x" * 40}).status_code == 200
    refused = client.post("/v1/uma/pins", json={"name": "b", "prompt": "y" * 20})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["type"] == "ConflictError" and "budget of 4.9 KiB" in error["message"]
    assert [p.name for p in book.pins(ledger)] == ["a"]
    warm = client.post(
        "/v1/uma/pins", json={"name": "w", "prompt": "z" * 10}, headers={WARM_UP_HEADER: "1"}
    )
    assert warm.status_code == 200

    def count(name, **labels):
        return registry.get_sample_value(f"vllm:kv_offload_{name}_total", labels)

    assert count("pin_requests", outcome="pinned", via="api") == 1
    assert count("pin_requests", outcome="over_budget", via="api") == 1
    assert count("pin_requests", outcome="pinned", via="warm_up") == 1
    assert count("pinned_prompt_tokens", via="api") == 32 * 4 + 5


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"prompt": "x" * 50}, 400, "not valid"),  # no name
        ({"name": "a"}, 400, "exactly one of"),
        ({"name": "a", "prompt": "x", "messages": []}, 400, "exactly one of"),
        ({"name": "a", "prompt": "x" * 50, "ttl": 5}, 400, "unknown key"),
        ({"name": "a", "prompt": "x" * 50, "ttl_s": -1}, 400, "ttl_s -1"),
        ({"name": "a", "prompt": "too long"}, 400, "too long"),  # vLLM's own error
        ({"name": "a", "prompt": "short"}, 400, "shorter than one KV block"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_bad_pin_requests_are_refused_and_change_nothing(store, monkeypatch, body, status, words):
    root, ledger = store
    client, _ = client_for(root, monkeypatch)
    reply = client.post("/v1/uma/pins", json=body)
    assert reply.status_code == status and words in reply.text
    assert book.pins(ledger) == []


def test_other_methods_and_non_json_are_refused(store, monkeypatch):
    client, _ = client_for(store[0], monkeypatch)
    assert client.put("/v1/uma/pins").status_code == 405
    assert client.post("/v1/uma/pins", content=b"{nope").status_code == 400
    assert client.get("/v1/uma/pinsx").status_code == 404  # not ours: vLLM's 404


def test_with_an_api_key_the_routes_need_it(store, monkeypatch):
    client, _ = client_for(store[0], monkeypatch, api_key="s3cret")
    assert client.get("/v1/uma/pins").status_code == 401
    ok = client.get("/v1/uma/pins", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    made = client.post(
        "/v1/uma/pins",
        json={"name": "a", "prompt": "x" * 50},
        headers={"Authorization": "Bearer s3cret"},
    )
    assert made.status_code == 200


def test_a_ledger_that_cannot_be_used_is_503_and_changes_nothing(store, monkeypatch):
    root, ledger = store
    client, _ = client_for(root, monkeypatch)
    # Another process holds the ledger's write lock past the busy timeout.
    monkeypatch.setattr("vllm_uma.kv_offload.disk.ledger.db.BUSY_TIMEOUT_S", 0.05)
    blocker = sqlite3.connect(root / NOINDEX / "ledger.sqlite3", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        reply = client.post("/v1/uma/pins", json={"name": "a", "prompt": "x" * 50})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert reply.status_code == 503 and "ledger could not be used" in reply.text
    assert book.pins(ledger) == []
