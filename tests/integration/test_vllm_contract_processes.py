"""The vLLM contract (plugin/vllm_contract/) from processes of its own: the
report command exits 0 here, and the check of modules that import no vLLM
module imports none. The entries and their failures:
tests/unit/test_vllm_contract.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vllm_uma.plugin.vllm_contract import ENTRIES

ROOT = Path(__file__).resolve().parents[2]


def test_the_report_command_exits_0_here():
    done = subprocess.run(
        [sys.executable, "-m", "vllm_uma.plugin.vllm_contract"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.splitlines()[-1]
    assert last.startswith(f"{len(ENTRIES)} of {len(ENTRIES)} entries hold"), last


# Modules that import no vLLM module must stay so with their contract check
# (its texts are read from vLLM's files); and the package's own import, which
# vLLM's plugin discovery goes through, imports none either.
LIGHT = [
    "vllm_uma",
    "vllm_uma.plugin.vllm_contract",
    "vllm_uma.commands.engine_watch",
    "vllm_uma.memory_release.l1_pages",
    "vllm_uma.plugin.lazy_kv",
    "vllm_uma.kv_offload.disk.namespace_inputs",
    "vllm_uma.kv_offload.refusals",
    "vllm_uma.kv_offload.weight_updates",
    "vllm_uma.lifeline",
]


def test_the_check_of_light_modules_imports_no_vllm_module():
    code = (
        "import importlib, sys\n"
        f"for name in {LIGHT!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
