"""The recipe registry (vllm_uma/models/__init__.py) in a fresh interpreter:
its import brings neither torch nor vLLM. The registry itself:
tests/unit/test_model_recipes.py."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_registry_imports_neither_torch_nor_vllm():
    # The CLI imports it to parse its command line and to print --help.
    code = (
        "import sys, vllm_uma.models; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
