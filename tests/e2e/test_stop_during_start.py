"""A stop while the real server starts is honoured at once (vllm_uma/startup_stop.py),
and a Ctrl-C of a serving server ends it quietly (vllm_uma/exit_without_collection.py).

The real `vllm-uma serve` with a disk tier is stopped (SIGTERM to its API
server, as systemd and docker send it) once its engine core is being built,
the window in which vLLM 0.32 loses the stop and comes up serving. Checked
with psutil: every process of the server's session gone within seconds,
the stop logged, the store left consistent for the next server.

A serving server is stopped as a terminal's Ctrl-C does it: SIGINT to every
process of its group. Every process exits, with a status that says stopped
(0 or 130), and nothing is printed after the server's last line but the
resource tracker's note: no traceback, no nanobind leak report for triton's
objects (what an exit with a frozen garbage collector printed). Before
that line, vLLM's own stop may log an EngineDeadError: with its default
shutdown timeout of 0 s it SIGKILLs the engine core right after its
SIGTERM, racing its own output handler (vllm/v1/utils.py ``shutdown``,
0.32.0); not ours to hide.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from tests.e2e.traffic import EAGER
from vllm_uma.kv_offload.disk import block_file
from vllm_uma.server_process import Server

pytestmark = pytest.mark.slow

# vLLM logs this from the engine-core process as it starts building it.
ENGINE_CORE_STARTED = "(EngineCore pid="
STOP_LINE = "SIGTERM while the server starts"
WAIT_S = 240.0


def session(pid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def test_a_sigterm_while_the_engine_core_is_built_stops_every_process(
    vllm_uma_exe, default_model_dir, tmp_path
):
    root = tmp_path / "kv"
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 1}
    config = json.dumps({"kv_connector_extra_config": {"secondary_tiers": [tier]}})
    args = [*EAGER, "--kv-offloading-size", "0.3", "--kv-transfer-config", config]
    srv = Server(vllm_uma_exe, args, tmp_path / "server.log")
    try:
        deadline = time.monotonic() + WAIT_S
        while ENGINE_CORE_STARTED not in srv.log() and time.monotonic() < deadline:
            assert srv.proc.poll() is None, srv.log()[-3000:]
            time.sleep(0.2)
        assert ENGINE_CORE_STARTED in srv.log()
        assert "Application startup complete" not in srv.log()  # still starting
        assert len(session(srv.proc.pid)) >= 2  # the API server and the engine core
        stopped = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        while session(srv.proc.pid) and time.monotonic() - stopped < 30:
            time.sleep(0.1)
        took = time.monotonic() - stopped
        assert session(srv.proc.pid) == [], srv.log()[-3000:]
        assert took < 10, took
        assert srv.proc.wait(5) == -signal.SIGTERM
        assert STOP_LINE in srv.log()
        assert "Application startup complete" not in srv.log()  # it never served
    finally:
        srv.stop()
    # Killed mid-start-up, the store holds no temp file a later start would trip on.
    noindex = root / ".noindex"
    if noindex.exists():
        assert not [p for p in noindex.rglob("*") if block_file.is_temp_name(p.name)]


def test_a_ctrl_c_of_a_serving_server_ends_it_quietly(vllm_uma_exe, default_model_dir, tmp_path):
    srv = Server(vllm_uma_exe, EAGER, tmp_path / "server.log").wait_ready(timeout=WAIT_S)
    try:
        srv.complete("SmolLM2-135M-Instruct", "Hello", 4)  # it served
        stopped = time.monotonic()
        os.killpg(srv.proc.pid, signal.SIGINT)  # the server leads its own group
        while session(srv.proc.pid) and time.monotonic() - stopped < 60:
            time.sleep(0.1)
        assert session(srv.proc.pid) == [], srv.log()[-3000:]
        assert srv.proc.wait(5) in (0, 130), srv.log()[-3000:]
    finally:
        srv.stop()
    log = srv.log()
    assert "Application shutdown complete" in log, log[-3000:]
    after = log.rpartition("Application shutdown complete")[2]
    assert "nanobind" not in after and "Traceback" not in after, after
