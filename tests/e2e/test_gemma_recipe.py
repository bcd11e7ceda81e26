"""gemma-3-270m end to end: the recipe's published build, and `vllm-uma serve
gemma-3-270m` answering by that name.

``make test`` prepares the model before pytest starts (make model-gemma), so
the fixture returns at once; run alone, it builds it (about 6 minutes).
One server, eager, like the other test servers: the recipe's own check has
already compared the build's float32 tokens with transformers'.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.traffic import EAGER
from vllm_uma import models
from vllm_uma.models import gemma3, publish
from vllm_uma.server_process import Server

pytestmark = pytest.mark.slow

NAME = "gemma-3-270m"
BOS = 2


@pytest.fixture(scope="module")
def gemma_dir():
    return models.prepare(NAME)


def test_the_published_build_is_complete(gemma_dir):
    assert gemma_dir == models.model_dir(NAME)
    assert publish.is_complete(gemma_dir, gemma3.RECIPE_VERSION, gemma3.locate().sha256)
    files = {p.name for p in gemma_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", gemma3.TERMS_FILE} <= files
    assert not [f for f in files if f.endswith(".gguf")]
    assert not list(gemma_dir.parent.glob(f".{NAME}{publish.PARTIAL_MARK}*"))
    config = json.loads((gemma_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["sliding_window"] == 512
    assert "quantization_config" not in config
    tokenizer_config = json.loads((gemma_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["add_bos_token"] is True


@pytest.fixture(scope="module")
def server(vllm_uma_exe, gemma_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("gemma") / "server.log"
    # By name: the command resolves it to the recipe's directory itself.
    args = [NAME, *EAGER, "--max-model-len", "1024", "--gpu-memory-utilization", "0.3"]
    srv = Server(vllm_uma_exe, args, log).wait_ready(timeout=900)
    try:
        yield srv
    finally:
        srv.stop()


def test_serve_by_name_answers_a_completion(server, gemma_dir):
    listed = requests.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["root"]) for m in listed] == [(NAME, str(gemma_dir))]
    reply = server.complete(NAME, gemma3.CHECK_PROMPT, gemma3.CHECK_TOKENS, return_token_ids=True)
    choice = reply["choices"][0]
    # vLLM's own tokenization starts with <bos>: the recipe's tokenizer fix
    # holds in the server, in bfloat16 as in the check's float32.
    assert choice["prompt_token_ids"][0] == BOS
    assert choice["prompt_token_ids"].count(BOS) == 1
    # The first 8 tokens' margins are 1.375 logits or more in bfloat16
    # (transformers): no kernel's rounding decides them.
    assert choice["text"].startswith(gemma3.CHECK_START), choice["text"]
    assert (len(choice["token_ids"]), choice["finish_reason"]) == (gemma3.CHECK_TOKENS, "length")


def test_a_base_model_refuses_chat_in_one_response(server):
    # No chat template: a chat request is the client's error, not a crash.
    response = requests.post(
        f"{server.url}/v1/chat/completions",
        json={"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "chat template" in response.json()["error"]["message"]
