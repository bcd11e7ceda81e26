"""The real server on the real default model, over HTTP.

Correctness is judged by vllm_uma/models/oracles.py, so that no test depends on
which kernels this machine's CPU runs:
- float32: greedy token ids equal transformers' float32 ones exactly;
- bfloat16: equal until transformers' own top two candidates are within a
  near-tie, then not compared (kernels may round such ties either way);
- the README's example: a question chosen for its margin (1.75 logits at
  its narrowest, smollm2.CHECK_PROMPT), whose exact answer must come
  back on every kernel path.
Kernel paths, both run here: the machine's own (oneDNN's best ISA for the
linear layers) and oneDNN capped, checked in the log so that the test fails
if the switch stops switching. Without AMX the cap is
``ONEDNN_MAX_CPU_ISA=AVX2``, which makes vLLM's oneDNN linear refuse bf16
and fall back to torch's linear. With AMX tiles that cap is refused (vLLM
picks AMX-era kernels by the CPU and they abort under it:
plugin/cpu_kernels.py), so the cap is AVX512_CORE_BF16: oneDNN's kernels
without AMX, as its verbose header says. vLLM's attention ISA is
fixed per machine (AMX where present, else its vector code) and cannot be
switched here; the oracles above hold whichever it is. On a CPU without
AVX-512 oneDNN has no bf16 matmul at all: both servers then run torch's
linear, and the test checks that both logs say so. Test servers run
eager to start sooner; one serves the compiled default, and a restart of it
loads the model it compiled (vLLM's compile cache) and answers the same.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from tests.e2e.traffic import BF16, EAGER
from tools.harness.reference import TransformersReference
from tools.harness.server import Server, model_process, proc_status
from vllm_uma import models
from vllm_uma.models import smollm2
from vllm_uma.plugin.memory import parse_breakdown

pytestmark = pytest.mark.slow

MODEL = models.DEFAULT_MODEL_NAME
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain in one sentence what a CPU cache is.",
]
COMPLETION_PROMPTS = [
    "The three primary colours are",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
MAX_TOKENS = 24
# The README's example: enough room for its answer, and a bound if it ran on.
README_MAX_TOKENS = 32
# Switches vLLM's bf16 linear layers to other kernels (see the docstring).
if torch.cpu._is_amx_tile_supported():
    CAPPED_LINEAR = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ONEDNN_VERBOSE": "profile_create"}
    CAPPED_LINEAR_LOG = "isa:Intel AVX-512 with Intel DL Boost and bfloat16 support"
else:
    CAPPED_LINEAR = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    CAPPED_LINEAR_LOG = "Failed to create oneDNN linear, fallback to torch linear"
# oneDNN has no bf16 matmul below AVX-512: on an AVX2 CPU the machine's own
# path already is torch's linear, and the cap switches nothing.
ONEDNN_BF16 = torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "AVX2")


COMPILED = [*BF16, "--max-model-len", "2048", "--gpu-memory-utilization", "0.3"]
# name -> (flags, environment). Test servers run eager to start sooner; one
# serves `vllm-uma serve`'s own default, torch.compile.
SERVERS = {
    "bf16": ([*EAGER, *BF16, "--gpu-memory-utilization", "0.5"], None),
    "bf16-capped": (
        [*EAGER, *BF16, "--max-model-len", "2048", "--gpu-memory-utilization", "0.3"],
        CAPPED_LINEAR,
    ),
    # Its own, empty compile cache: this start compiles and saves the model,
    # the restart below loads it (COMPILE_CACHE is filled in per run).
    "bf16-compiled": (COMPILED, "compile-cache"),
    # Also the server that checks --no-wire-weights, to save a start-up.
    "fp32": (
        [
            *EAGER,
            *("--dtype", "float32", "--max-model-len", "2048"),
            *("--gpu-memory-utilization", "0.3", "--no-wire-weights"),
        ],
        None,
    ),
}


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> dict[str, str]:
    """An empty vLLM compile cache for the compiled servers of this module."""
    return {"VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache"))}


@pytest.fixture(scope="module")
def launched(vllm_uma_exe, default_model_dir, tmp_path_factory, compile_cache):
    """Every server of this module, launched at once: a start-up is mostly
    one core importing Python, so theirs overlap; each is stopped at the end."""
    servers = {}
    try:
        for name, (args, env) in SERVERS.items():
            log = tmp_path_factory.mktemp(name) / "server.log"
            env = compile_cache if env == "compile-cache" else env
            servers[name] = Server(vllm_uma_exe, args, log, env=env)
        yield servers
    finally:
        for srv in servers.values():
            srv.stop()


def ready(launched, name: str) -> Server:
    return launched[name].wait_ready(timeout=900)


@pytest.fixture(scope="module")
def server(launched):
    return ready(launched, "bf16")


@pytest.fixture(scope="module")
def server_capped(launched):
    return ready(launched, "bf16-capped")


@pytest.fixture(scope="module")
def server_compiled(launched):
    return ready(launched, "bf16-compiled")


@pytest.fixture(scope="module")
def server_compiled_again(launched, server_compiled, vllm_uma_exe, compile_cache, tmp_path_factory):
    """A restart of the compiled server: same flags, same compile cache,
    started once the first one had compiled and saved the model."""
    log = tmp_path_factory.mktemp("bf16-compiled-again") / "server.log"
    launched["bf16-compiled-again"] = Server(vllm_uma_exe, COMPILED, log, env=compile_cache)
    return ready(launched, "bf16-compiled-again")


@pytest.fixture(scope="module")
def server_fp32(launched):
    return ready(launched, "fp32")


@pytest.fixture(scope="module")
def reference(default_model_dir):
    return TransformersReference(default_model_dir, "bfloat16")


@pytest.fixture(scope="module")
def reference_fp32(default_model_dir):
    return TransformersReference(default_model_dir, "float32")


def test_log_says_the_plugin_is_activated(server):
    assert "vllm-uma platform plugin activated" in server.log()


def readme_answer(server) -> tuple[str, str]:
    reply = server.chat(MODEL, smollm2.CHECK_PROMPT, README_MAX_TOKENS)
    choice = reply["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


@pytest.mark.parametrize("name", ["server", "server_capped", "server_compiled"])
def test_the_readme_example_answers_as_the_readme_says(request, name):
    answer, finish = readme_answer(request.getfixturevalue(name))
    assert (answer, finish) == (smollm2.CHECK_ANSWER, "stop")


def test_the_capped_server_really_runs_other_linear_kernels(server, server_capped):
    assert CAPPED_LINEAR_LOG in server_capped.log()
    if ONEDNN_BF16:
        assert CAPPED_LINEAR_LOG not in server.log()
    else:
        # Nothing to switch on this CPU: both run torch's linear, as both say.
        assert "Failed to create oneDNN linear" in server.log()


def chat(server, question):
    reply = server.chat(MODEL, question, MAX_TOKENS, return_token_ids=True)
    messages = [{"role": "user", "content": question}]
    return messages, reply["prompt_token_ids"], reply["choices"][0]["token_ids"]


def complete(server, prompt):
    reply = server.complete(MODEL, prompt, MAX_TOKENS, return_token_ids=True)
    choice = reply["choices"][0]
    return choice["prompt_token_ids"], choice["token_ids"]


# Server fixture -> reference fixture: the reference's dtype sets the oracle.
VARIANTS = {
    "fp32": ("server_fp32", "reference_fp32"),
    "bf16": ("server", "reference"),
    "bf16-capped-linear": ("server_capped", "reference"),
    "bf16-compiled": ("server_compiled", "reference"),
    "bf16-compiled-restart": ("server_compiled_again", "reference"),
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request):
    server_name, reference_name = VARIANTS[request.param]
    return request.getfixturevalue(server_name), request.getfixturevalue(reference_name)


@pytest.mark.parametrize("question", CHAT_PROMPTS)
def test_chat_greedy_matches_transformers(variant, question):
    server, reference = variant
    messages, prompt_ids, served = chat(server, question)
    expected_prompt = reference.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert prompt_ids == list(expected_prompt)
    verdict = reference.judge(prompt_ids, served, MAX_TOKENS)
    assert verdict, verdict.detail


@pytest.mark.parametrize("prompt", COMPLETION_PROMPTS)
def test_completion_greedy_matches_transformers(variant, prompt):
    server, reference = variant
    prompt_ids, served = complete(server, prompt)
    assert prompt_ids == reference.tokenizer(prompt)["input_ids"]
    verdict = reference.judge(prompt_ids, served, MAX_TOKENS)
    assert verdict, verdict.detail


def test_a_restart_loads_the_compiled_model(server_compiled, server_compiled_again):
    """vllm-uma's inductor backend (plugin/compiled_model.py): the first
    start saves vLLM's AOT artifact, the second loads it, no compile."""
    assert "saved AOT compiled function" in server_compiled.log()
    again = server_compiled_again.log()
    assert "Directly load AOT compilation" in again
    assert "Compiling model again" not in again


@pytest.mark.parametrize("prompt", COMPLETION_PROMPTS)
def test_the_loaded_model_answers_as_the_compiled_one(
    server_compiled, server_compiled_again, prompt
):
    # The same kernels, compiled once: the same token ids, bf16 or not.
    assert complete(server_compiled_again, prompt) == complete(server_compiled, prompt)


def breakdown_of(server) -> dict[str, int]:
    lines = [line for line in server.log().splitlines() if "memory breakdown:" in line]
    assert len(lines) == 1, "exactly one breakdown line at start-up"
    return parse_breakdown(lines[0])


def test_breakdown_is_consistent(server):
    b = breakdown_of(server)
    assert b["budget"] == int(b["total"] * 0.5)
    assert b["weights"] + b["activations"] + b["kv_offload_pool"] + b["kv_cache"] <= b["budget"]
    # The KV cache gets (within one block) what the budget leaves.
    leftover = b["budget"] - b["weights"] - b["activations"] - b["kv_cache"]
    assert 0 <= leftover < b["per_block_bytes"]
    assert b["num_blocks"] * b["per_block_bytes"] == b["kv_cache"]
    # SmolLM2-135M in bf16: 23,040 bytes of KV per token.
    tokens_per_block = b["per_block_bytes"] // 23_040
    # vllm-uma's own block size (plugin/block_size.py), not vLLM CPU's 128.
    assert (tokens_per_block, b["block_size"], b["kv_groups"]) == (32, 32, 1)
    assert "KV cache blocks of 32 tokens (vLLM CPU's default is 128)" in server.log()
    assert b["max_tokens_cached"] == b["num_blocks"] * tokens_per_block


def test_worker_rss_at_ready_is_not_the_kv_cache(server):
    b = breakdown_of(server)
    rss = model_process(server.proc.pid).memory_info().rss
    assert rss <= b["weights"] + b["activations"] + 0.05 * b["kv_cache"], (rss, b)


@pytest.mark.skipif(os.geteuid() != 0, reason="mlock of 0.5 GiB needs root or a raised ulimit -l")
def test_weights_are_wired(server):
    b = breakdown_of(server)
    assert b["wired"] >= 0.9 * b["weights"]
    assert proc_status(model_process(server.proc.pid).pid, "VmLck") >= 0.9 * b["wired"]


def test_wiring_can_be_turned_off(server_fp32):
    assert "Weights not wired (wire_weights is off)." in server_fp32.log()
    assert breakdown_of(server_fp32)["wired"] == 0
    assert proc_status(model_process(server_fp32.proc.pid).pid, "VmLck") == 0


def test_rss_grows_with_tokens_cached(server_fp32):
    # On the float32 server: lazy KV does not depend on the precision, and
    # a CPU without bf16 arithmetic computes these prompts 8x faster so.
    server = server_fp32
    worker = model_process(server.proc.pid)
    before = worker.memory_info().rss
    # About 1,800 tokens each (the server's --max-model-len is 2,048); the
    # leading number makes every prompt differ from its first block on, so
    # no prefix is shared between them.
    text = "apple river stone cloud " * 450
    tokens = 0
    for i in range(8):
        reply = server.post(
            "/v1/completions",
            {"model": MODEL, "prompt": f"{i} {text}", "max_tokens": 1},
        )
        tokens += reply["usage"]["prompt_tokens"]
    grown = worker.memory_info().rss - before
    # Lazy KV: RSS follows the tokens cached (46,080 B each for this model
    # in float32), but for the warm reserve's blocks, which were resident before.
    breakdown = breakdown_of(server)
    per_token = breakdown["per_block_bytes"] // breakdown["block_size"]
    assert per_token == 46_080, breakdown
    blocks = int(re.search(r"KV warm reserve: the next (\d+) free KV blocks", server.log())[1])
    reserve = blocks * breakdown["block_size"]
    assert tokens > reserve + 4_000, "the prompts must outgrow the reserve"
    assert grown >= 0.8 * (tokens - reserve) * per_token, (grown, tokens, reserve)
