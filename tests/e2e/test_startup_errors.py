"""Start-up failures through the real command: one clear line, no traceback.

One case per route a refusal takes to the user: the command's preflight
(a busy port; the model-path, JSON and offloading refusals it makes take the
same route and are unit tests, tests/unit/test_preflight.py and
test_preflight_config.py; test_preflight_imports.py shows they come before
vLLM is imported), the platform hook inside vLLM's
config validation (an offloading refusal; the disk tier's trust refusals
take the same route, tests/unit/test_disk_trust.py), and a failure after
validation (a memory budget too small for the model)."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from tests.e2e.traffic import EAGER
from vllm_uma.server_process import Server

pytestmark = pytest.mark.slow


def run_serve(exe: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, "serve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("vllm-uma serve: error: "), last
    for fragment in fragments:
        assert fragment in last, last


def test_busy_port(vllm_uma_exe, default_model_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_serve(vllm_uma_exe, "--host", "127.0.0.1", "--port", str(port))
    assert_one_line_error(result, f"127.0.0.1:{port} is already in use", "--port")


def test_budget_too_small_shows_breakdown_and_fix(vllm_uma_exe, default_model_dir, tmp_path):
    # 1% of the RAM cannot hold the weights, the runtime and one request.
    srv = Server(
        vllm_uma_exe, [*EAGER, "--gpu-memory-utilization", "0.01"], tmp_path / "server.log"
    )
    try:
        # Found by the engine after profiling: a failure, not a usage error.
        assert srv.proc.wait(timeout=240) == 1
    finally:
        srv.stop()
    log = srv.log()
    line = next(x for x in log.splitlines() if "Memory budget too small" in x)
    assert "--gpu-memory-utilization=0.01 gives a budget of" in line
    assert "weights" in line and "activations" in line and "8192-token request" in line
    assert "raise --gpu-memory-utilization to at least" in line
    # Python's resource tracker may warn after our line, at interpreter exit.
    tail = log.strip().splitlines()[-5:]
    assert any(x.startswith("vllm-uma serve: error: ") for x in tail), tail


def disk_tier_flags(root) -> list[str]:
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 1}
    config = {"kv_connector_extra_config": {"secondary_tiers": [tier]}}
    return ["--kv-transfer-config", json.dumps(config)]


def test_an_offloading_refusal_is_one_line(vllm_uma_exe, default_model_dir):
    # The platform refuses in the API server, before vLLM starts its engine
    # (a root_dir that cannot be created is left to it by the preflight).
    # Each refusal's own message is a unit test (test_offload_config.py:
    # --kv-offloading-backend, pipeline parallelism; test_disk_settings.py:
    # tier types, root_dir; test_disk_trust.py: the store's trust rules);
    # this one shows the path from the platform to the command's one line.
    result = run_serve(vllm_uma_exe, "--kv-offloading-size", "1", *disk_tier_flags("/proc/kv"))
    assert_one_line_error(result, "fs tier root_dir='/proc/kv' cannot be created or written")
