"""The recipe registry and how names resolve (vllm_uma/models/__init__.py).
What its import brings into a fresh interpreter: tests/integration/test_model_recipes_imports.py."""

from __future__ import annotations

import pytest

from vllm_uma import models


def test_the_registry_holds_every_recipe_under_its_served_name():
    assert sorted(models.RECIPES) == [
        "Qwen2.5-Coder-1.5B-Instruct",
        "SmolLM2-135M-Instruct",
        "gemma-3-270m",
    ]
    for name, recipe in models.RECIPES.items():
        assert recipe.name == name
    assert models.get_recipe(None).name == models.DEFAULT_MODEL_NAME == "SmolLM2-135M-Instruct"


def test_the_registry_is_read_only():
    with pytest.raises(TypeError):
        models.RECIPES["mine"] = models.get_recipe(None)  # type: ignore[index]


@pytest.mark.parametrize(
    "name, known",
    [
        ("gemma-3-270m", True),
        ("SmolLM2-135M-Instruct", True),
        ("Qwen2.5-Coder-1.5B-Instruct", True),
        ("qwen2.5-coder-1.5b-instruct", False),
        ("Gemma-3-270M", False),  # served names are case-sensitive
        ("./gemma-3-270m", False),  # a path
        ("google/gemma-3-270m", False),  # a hub id
        ("", False),
    ],
)
def test_is_recipe_is_exact(name, known):
    assert models.is_recipe(name) is known


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(models.PrepareError) as err:
        models.get_recipe("gemma")
    assert str(err.value) == (
        "no model recipe is called 'gemma'; the known ones are SmolLM2-135M-Instruct "
        "(the default), Qwen2.5-Coder-1.5B-Instruct, gemma-3-270m. Name one of those, or "
        "leave the name out for the default."
    )


def test_model_dir_is_the_name_under_models(tmp_path):
    assert models.model_dir("gemma-3-270m", tmp_path) == tmp_path / "models" / "gemma-3-270m"
    assert models.model_dir(None, tmp_path) == tmp_path / "models" / "SmolLM2-135M-Instruct"


@pytest.mark.parametrize("name", [None, "SmolLM2-135M-Instruct", "gemma-3-270m"])
def test_prepare_builds_the_named_recipe(monkeypatch, tmp_path, name):
    asked = []

    def fake(recipe, root, progress):
        asked.append((recipe.name, root))
        return root / "models" / recipe.name

    monkeypatch.setattr(models, "prepare_recipe", fake)
    path = models.prepare(name, tmp_path)
    expected = name or models.DEFAULT_MODEL_NAME
    assert asked == [(expected, tmp_path)]
    assert path == tmp_path / "models" / expected


def test_prepare_refuses_an_unknown_name_before_building(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "prepare_recipe", lambda *a: pytest.fail("built"))
    with pytest.raises(models.PrepareError, match="no model recipe is called 'nope'"):
        models.prepare("nope", tmp_path)
