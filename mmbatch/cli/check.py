"""``mmbatch check RECIPE... [--model M]``: validate recipes without starting an engine.

A recipe is described as a dry run describes it (``mmbatch.cli.describe``); check goes on to
vLLM's own reading of the recipe's engine settings and of the model it names."""

from __future__ import annotations

import argparse
import sys

from mmbatch.cli.options import (
    EXIT_JOB_FAILED,
    EXIT_OK,
    Commands,
    add_verbose_option,
    quiet_unless_verbose,
)


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "check",
        help="validate recipes (keys, types, schemas, engine arguments; with --model, whether "
        "that model can run them); starts no engine",
        description="Validate each RECIPE and print what it would run; every problem found "
        "is listed, unknown keys by name, [engine] arguments against vLLM's. With --model "
        "(or a model the recipe names that is on this machine), say whether that model can "
        "run it: its media, and the context the recipe needs against the model's, read from "
        "the model's config and processor without starting an engine.",
    )
    parser.add_argument("recipes", nargs="+", metavar="RECIPE")
    parser.add_argument("--model", default=None, help="check the recipes against this model")
    add_verbose_option(parser, "by default it is left out")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.errors import ConfigError

    code = EXIT_OK
    for path in args.recipes:
        try:
            with quiet_unless_verbose(args):
                lines = _check(path, args.model)
        except ConfigError as exc:
            message = str(exc) if str(exc).startswith(path) else f"{path}: {exc}"
            print(f"mmbatch: error: {message}", file=sys.stderr)
            code = EXIT_JOB_FAILED
            continue
        print("\n  ".join(lines))
    return code


def _check(path: str, model_option: str | None) -> list[str]:
    from mmbatch.cli.describe import describe_recipe
    from mmbatch.engine.config import EngineConfig, check_model_name
    from mmbatch.engine.processor import model_is_here
    from mmbatch.engine.vllm_settings import check_engine_arguments
    from mmbatch.recipe.fit import describe_fit
    from mmbatch.recipe.spec import load_recipe

    recipe = load_recipe(path)
    check_engine_arguments(recipe.engine_kwargs())
    model = model_option or recipe.model
    lines = [describe_recipe(path, recipe, model)]
    if model is None:
        return lines
    check_model_name(model)
    if model_option is None and not model_is_here(model):
        lines.append(
            f"model {model}: not checked (not on this machine; --model {model} checks it, "
            "fetching its config from the hub)"
        )
        return lines
    lines.append(describe_fit(recipe, EngineConfig(model, recipe.engine_kwargs())))
    return lines
