"""The preflight refuses before vLLM or torch is imported, through the real command.

Not a timing (this machine's load varies): Python's own import log
(PYTHONPROFILEIMPORTTIME, one line per module imported) must name no
``vllm`` or ``torch`` module, whose import is what takes 10-40 s. The
messages themselves are unit tests (tests/unit/test_preflight.py,
test_preflight_config.py); tools/benchmark/preflight_refusals.py times them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess

import pytest

# "import time:  self |  cumulative | <indent>module"
HEAVY = re.compile(r"^import time:.*\|\s*(vllm|torch)(\.\S+)?\s*$")


def refuse(exe: str, *args: str) -> str:
    """Run ``vllm-uma serve ARGS``; its one-line error, once checked that it
    exited 2 without importing vLLM or torch."""
    result = subprocess.run(
        [exe, "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert any(x.startswith("import time:") for x in lines), "no import log"
    heavy = [x for x in lines if HEAVY.match(x)]
    assert not heavy, heavy[:5]
    errors = [x for x in lines if not x.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("vllm-uma serve: error: "), errors
    return errors[0]


def test_a_missing_model_directory(vllm_uma_exe, tmp_path):
    missing = tmp_path / "no-such-model"
    line = refuse(vllm_uma_exe, str(missing), "--port", "0")
    assert f"model directory {str(missing)!r} does not exist" in line


def test_a_busy_port(vllm_uma_exe, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = refuse(vllm_uma_exe, str(tmp_path), "--host", "127.0.0.1", "--port", str(port))
    assert f"127.0.0.1:{port} is already in use" in line


def test_a_disk_root_others_may_write(vllm_uma_exe, tmp_path):
    root = tmp_path / "kv"
    root.mkdir()
    root.chmod(0o777)
    tier = {"type": "fs", "root_dir": str(root), "max_size_gib": 1}
    config = json.dumps({"kv_connector_extra_config": {"secondary_tiers": [tier]}})
    line = refuse(
        vllm_uma_exe, "--port", "0", "--kv-offloading-size", "1", "--kv-transfer-config", config
    )
    assert "is writable by group or others (mode 0777)" in line


@pytest.mark.parametrize("text", ['{"kv_connector": ', "[1]"])
def test_a_kv_transfer_config_vllm_cannot_read(vllm_uma_exe, text):
    line = refuse(vllm_uma_exe, "--port", "0", "--kv-transfer-config", text)
    assert line.startswith(f"vllm-uma serve: error: --kv-transfer-config {text!r} is ")


def test_help_is_given_whatever_the_engines_runtime_setting_says(vllm_uma_exe):
    # --help starts no engine core: a VLLM_UMA_PRELOAD that a start would
    # refuse (commands/runtime_preload.py) waits for that start.
    result = subprocess.run(
        [vllm_uma_exe, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "VLLM_UMA_PRELOAD": "jemalloc"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage: vllm-uma serve" in result.stdout
