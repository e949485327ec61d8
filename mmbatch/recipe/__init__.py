"""Recipes: a job described in one TOML file (``spec``), and applied to inputs (``requests``)."""

from mmbatch.recipe.spec import Recipe, load_recipe

__all__ = ["Recipe", "load_recipe"]
