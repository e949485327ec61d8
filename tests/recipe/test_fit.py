"""Recipes on any model: the engine is sized from what the recipe needs of the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_paths import RECIPES

from mmbatch.cli import EXIT_OK, main
from mmbatch.engine.config import EngineConfig
from mmbatch.recipe.fit import recipe_needs
from mmbatch.recipe.spec import load_recipe


def test_no_bundled_recipe_hard_codes_the_context() -> None:
    for path in RECIPES.glob("*.toml"):
        assert "max_model_len" not in load_recipe(path).engine, path.name


@pytest.mark.slow
def test_run_sizes_the_context_to_the_recipe_and_its_prompts_fit(
    tiny_vl_model: Path, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = RECIPES / "short_caption.toml"
    out = tmp_path / "c.jsonl"
    inputs = [str(samples / name) for name in ("sunset.jpg", "checkerboard.png")]
    argv = ["run", str(recipe), *inputs, "--model", str(tiny_vl_model)]
    argv += ["--engine-arg", "enforce_eager=true", "--out", str(out), "--no-progress"]
    assert main(argv) == EXIT_OK
    err = capsys.readouterr().err
    assert "mmbatch: max_model_len 256: the recipe needs " in err
    needs = recipe_needs(load_recipe(recipe), EngineConfig(str(tiny_vl_model)))
    assert needs is not None
    for row in map(json.loads, out.read_text().splitlines()):
        # The count is an upper bound for any picture the recipe lets through, and close.
        prompt = row["outputs"]["caption"]["prompt_tokens"]
        assert needs.text + needs.media - 4 <= prompt <= needs.text + needs.media
