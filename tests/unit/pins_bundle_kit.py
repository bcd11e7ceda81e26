"""A pin's bundle over HTTP, the test side: a pins middleware on a small
Starlette app over a real store (tests/unit/test_pins_http_bundles.py,
tests/integration/test_pins_http_bundles_uvicorn.py)."""

from __future__ import annotations

import argparse
import os
import sqlite3
import types
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tests.unit.disk_tier_kit import FILE, NS, ROWS, Jobs, Primary, key, make_tier
from vllm_uma.kv_offload.config import OffloadPlan
from vllm_uma.kv_offload.disk.layout import BlockRef, Layout
from vllm_uma.kv_offload.disk.ledger.blocks import Ledger
from vllm_uma.kv_offload.disk.settings import DiskTierSettings
from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.http_api import PinRoutes
from vllm_uma.kv_offload.pool_size import PoolSize
from vllm_uma.plugin import settings_plan
from vllm_uma.plugin.uma_settings import UmaSettings

KEYS = [key(k) for k in range(4)]
BUNDLE_URL = "/v1/uma/pins/system/bundle"
IMPORT_URL = "/v1/uma/pins/import"
TAR = {"Content-Type": "application/x-tar"}


class Server:
    """A pins middleware on the store at ``root``; the engine stand-in
    reports ``engine_ns`` (None: an answer without one)."""

    def __init__(self, root, monkeypatch, *, engine_ns=NS, api_key=None, cap_blocks=100):
        self.probes: list[dict] = []

        async def completions(request: Request):
            self.probes.append(await request.json())
            facts = {} if engine_ns is None else {"namespace": engine_ns.hex(), "keys": []}
            return JSONResponse({"kv_transfer_params": {"vllm_uma_pin": facts}})

        self.app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
        disk = DiskTierSettings(
            root_dir=root, cap_bytes=cap_blocks * FILE, enable_kv_events=False, cap_reason="t"
        )
        self.plan = settings_plan.SettingsPlan(
            uma=UmaSettings(), offload=OffloadPlan("tiered", PoolSize(1 << 20, "t"), disk, None, ())
        )
        self.monkeypatch = monkeypatch
        self.use()
        config = types.SimpleNamespace(additional_config={})
        settings_plan.attach(config, self.plan)
        self.app.state.vllm_config = config
        self.app.state.args = argparse.Namespace(
            api_key=None if api_key is None else [api_key], served_model_name=["m"], model="/m"
        )
        self.app.add_middleware(PinRoutes, registry=CollectorRegistry())
        self.client = TestClient(self.app)

    def use(self):
        """The plan is per process ($VLLM_UMA_PLAN): this server's, now."""
        self.monkeypatch.setenv(settings_plan.PLAN_ENV, settings_plan.dumps(self.plan))

    def request(self, method, url, **kw):
        self.use()
        return self.client.request(method, url, **kw)


def a_store(root: Path, primary: Primary, ns: bytes = NS, keys: list[bytes] = ()) -> None:
    """A store as a server leaves it: its namespace, its ledger, and the
    blocks of ``keys`` stored by the real disk tier (rows seeded 1 to 8)."""
    tier = make_tier(root, primary, ns=ns, io_threads=4)
    for row in range(ROWS):
        primary.fill(row, seed=row + 1)
    jobs = Jobs(tier)
    parts = [keys[i : i + ROWS] for i in range(0, len(keys), ROWS)]
    done = jobs.wait(*(jobs.store(part, list(range(len(part)))) for part in parts), timeout=120)
    assert all(result.success for result in done)
    tier.shutdown()


def pin(root: Path, name="system", keys=KEYS) -> None:
    ledger = Ledger(root / ".noindex")
    book.pin(
        ledger, NS, name, keys, block_bytes=FILE, tokens=16 * len(keys), ttl_s=3600.0,
        budget=book.PinBudget(0.5, None),
    )  # fmt: skip
    ledger.close()


def block_path(root: Path, k: bytes) -> Path:
    return Layout(root).path(BlockRef(NS, k))


def scratch(root: Path) -> list[str]:
    base = root / ".noindex" / "http-bundles"
    return sorted(os.listdir(base)) if base.exists() else []


def state(root: Path) -> tuple:
    """Every file under .noindex but the ledger's (scratch included), the
    ledger's block rows and pins."""
    noindex = root / ".noindex"
    files = sorted(
        (str(p.relative_to(noindex)), p.read_bytes())
        for p in noindex.rglob("*")
        if p.is_file() and not p.name.startswith("ledger.sqlite3")
    )
    db = sqlite3.connect(noindex / "ledger.sqlite3")
    rows = db.execute("SELECT ns, key, size, state FROM blocks ORDER BY ns, key").fetchall()
    pins = db.execute("SELECT ns, name FROM pins").fetchall()
    pins += db.execute("SELECT * FROM pin_blocks ORDER BY ns, name, pos").fetchall()
    db.close()
    return files, rows, pins
