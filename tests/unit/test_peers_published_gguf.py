"""tools/peers/published_gguf.py: the GGUF a recipe was built from, for llama.cpp."""

from __future__ import annotations

import pytest

from tools.peers import published_gguf
from tools.peers.errors import PeerError


def test_a_4bit_build_names_the_recipe_it_derives_from():
    assert published_gguf.base_name("Qwen2.5-Coder-1.5B-Instruct-int4-rtn") == (
        "Qwen2.5-Coder-1.5B-Instruct"
    )
    assert published_gguf.base_name("gemma-3-270m") == "gemma-3-270m"


def test_a_model_without_a_published_gguf_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(PeerError) as err:
        published_gguf.ensure("/some/dir", tmp_path)
    message = str(err.value)
    assert "'/some/dir' is not a recipe built from a published GGUF" in message
    assert "Qwen2.5-Coder-1.5B-Instruct" in message and "--gguf FILE" in message


def _fake_recipe(monkeypatch, made):
    def assemble(target_dir, say):
        made.append(target_dir)
        (target_dir / "m.gguf").write_bytes(b"GGUF")
        return target_dir / "m.gguf"

    monkeypatch.setitem(published_gguf._ASSEMBLED, "fake", assemble)


def test_an_assembled_source_is_made_once_and_reused(tmp_path, monkeypatch):
    made = []
    _fake_recipe(monkeypatch, made)
    first = published_gguf.ensure("fake-int4-rtn", tmp_path, say=lambda _: None)
    again = published_gguf.ensure("fake", tmp_path, say=lambda _: None)
    assert first == again == tmp_path / "gguf" / "fake" / "m.gguf"
    assert first.read_bytes() == b"GGUF" and len(made) == 1
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == ["fake"]  # no .partial left


def test_a_failed_join_leaves_nothing_that_looks_whole(tmp_path, monkeypatch):
    from vllm_uma.models.recipe import PrepareError

    def broken(target_dir, say):
        (target_dir / "m.gguf").write_bytes(b"GG")  # half a file
        raise PrepareError("the joined m.gguf has sha256 0, the recipe records 1")

    monkeypatch.setitem(published_gguf._ASSEMBLED, "fake", broken)
    with pytest.raises(PeerError, match="--gguf published: the joined m.gguf has sha256 0"):
        published_gguf.ensure("fake", tmp_path, say=lambda _: None)
    assert list((tmp_path / "gguf").iterdir()) == []
