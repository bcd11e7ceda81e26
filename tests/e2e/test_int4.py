"""The default model's 4-bit build end to end: served where vLLM CPU has its
int4 kernel, refused in one line where it has not.

``vllm-uma prepare-model --int4`` makes SmolLM2-135M-Instruct-int4-rtn
(models/int4.py). On an AVX-512 CPU a real ``vllm-uma serve`` of it, in
bfloat16, eager, with a small context, must run vLLM's int4 kernel and give
the recipe's 4-bit answer; on a CPU without AVX-512 the same command must
refuse it before vLLM loads, with preflight_int4's line. Either behaviour
broken fails the test on its kind of CPU. One server of its own, or none.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.e2e.traffic import EAGER
from vllm_uma import models
from vllm_uma.commands.preflight_int4 import int4_weights, kernel_refusal
from vllm_uma.models import gptq_rtn, int4, smollm2
from vllm_uma.models.publish import MANIFEST_NAME, Manifest
from vllm_uma.plugin import cpu_features
from vllm_uma.server_process import Server

pytestmark = pytest.mark.slow

NAME = models.DEFAULT_MODEL_NAME + int4.SUFFIX
CHECK = smollm2.INT4_CHECK
# vLLM's line when it builds a 4-bit linear (auto_gptq.py): our kernel (plugin/int4_linear.py).
KERNEL_LINE = "Using TorchInt4LinearKernel for AutoGPTQLinearMethod"


@pytest.fixture(scope="module")
def int4_dir(default_model_dir):
    return models.prepare_int4()


@pytest.fixture(scope="module")
def cpu():
    features = cpu_features.read()
    if features is None:
        pytest.skip("not an x86 CPU with /proc/cpuinfo: vLLM decides there")
    return features


def test_the_published_build(int4_dir, default_model_dir):
    assert int4_dir == default_model_dir.parent / NAME  # beside its source
    manifest = Manifest.read(int4_dir / MANIFEST_NAME)
    assert manifest.recipe_version == smollm2.RECIPE_VERSION * 100 + int4.INT4_VERSION
    config = json.loads((int4_dir / "config.json").read_text())
    assert config["quantization_config"] == gptq_rtn.quantization_config(
        64, models.DEFAULT_MODEL_NAME
    )
    # Weights in a third of bf16's bytes plus the unquantized embeddings.
    assert (int4_dir / "model.safetensors").stat().st_size < 120e6


def test_served_with_the_int4_kernel_on_avx512(vllm_uma_exe, int4_dir, cpu, tmp_path):
    if not cpu.avx512:
        pytest.skip("no AVX-512: the refusal below is this CPU's behaviour")
    log = tmp_path / "server.log"
    args = [str(int4_dir), "--served-model-name", NAME, *EAGER, "--dtype", "bfloat16",
            "--max-model-len", "512", "--gpu-memory-utilization", "0.2"]  # fmt: skip
    srv = Server(vllm_uma_exe, args, log).wait_ready(timeout=900)
    try:
        reply = srv.chat(NAME, CHECK.question, CHECK.tokens)
    finally:
        srv.stop()
    assert reply["choices"][0]["message"]["content"].startswith(CHECK.start), reply
    assert KERNEL_LINE in log.read_text()


def test_refused_before_vllm_loads_without_avx512(vllm_uma_exe, int4_dir, cpu):
    if cpu.avx512:
        pytest.skip("AVX-512: served above")
    started = time.monotonic()
    result = subprocess.run(
        [vllm_uma_exe, "serve", str(int4_dir), "--dtype", "bfloat16", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-2000:]
    want = kernel_refusal(str(int4_dir), int4_weights(str(int4_dir)), cpu)
    assert result.stderr == f"vllm-uma serve: error: {want}\n"
    assert "vllm-uma serve SmolLM2-135M-Instruct" in want  # the fix names the weights
    assert seconds < 10, f"{seconds:.1f} s: vLLM was imported before the refusal"
