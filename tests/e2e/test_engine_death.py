"""A crash of the engine core is loud: a stack in the log, a non-zero exit.

The crash is real: SIGILL sent to the engine-core process, as an AMX
instruction without the tile permission raises it (vllm_uma/plugin/cpu_kernels.py).
"""

from __future__ import annotations

import os
import signal

import pytest
import requests

from tests.e2e.traffic import EAGER, MODEL
from tools.harness.server import Server, model_process
from vllm_uma.plugin import precision

pytestmark = pytest.mark.slow


def test_a_dead_engine_prints_its_stack_and_the_server_exits_1(
    vllm_uma_exe, default_model_dir, tmp_path
):
    server = Server(vllm_uma_exe, [*EAGER, "--max-model-len", "1024"], tmp_path / "server.log")
    try:
        server.wait_ready()
        os.kill(model_process(server.proc.pid).pid, signal.SIGILL)
        with pytest.raises(requests.RequestException):
            server.post(
                "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 4}, timeout=60
            )
        assert server.proc.wait(timeout=60) == 1
    finally:
        server.stop()
    log = server.log()
    # This server runs --dtype auto: float32 where the CPU has no bf16
    # arithmetic, the checkpoint's bf16 elsewhere (vllm_uma/plugin/precision.py).
    auto = "float32" if not precision.has_bf16_arithmetic() else "bfloat16"
    assert f"dtype=torch.{auto}," in log
    # Said once, by the API server (the engine core runs the hook again).
    said = log.count("Serving in float32: this CPU has no bfloat16 arithmetic")
    assert said == (1 if auto == "float32" else 0), said
    assert "Fatal Python error: Illegal instruction" in log  # faulthandler's stack
    last = [line for line in log.splitlines() if line.startswith("vllm-uma serve: error: ")]
    assert last and "the engine core died while serving" in last[-1]
