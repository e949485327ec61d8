"""``mmbatch check RECIPE...``: validate recipes without starting an engine."""

from __future__ import annotations

import argparse
import sys

from mmbatch.cli.options import EXIT_JOB_FAILED, EXIT_OK, Commands


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "check",
        help="validate recipe files (unknown keys, types, JSON schemas); starts no engine",
        description="Validate each RECIPE and print what it would run; every problem found "
        "is listed, unknown keys by name.",
    )
    parser.add_argument("recipes", nargs="+", metavar="RECIPE")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.errors import ConfigError
    from mmbatch.recipe.spec import load_recipe

    code = EXIT_OK
    for path in args.recipes:
        try:
            recipe = load_recipe(path)
        except ConfigError as exc:
            print(f"mmbatch: error: {exc}", file=sys.stderr)
            code = EXIT_JOB_FAILED
            continue
        questions = ", ".join(q.name for q in recipe.questions)
        output = "json (schema enforced)" if recipe.output.format == "json" else "text"
        print(
            f"{path}: ok: {recipe.name}: {recipe.media.kind} input, "
            f"{len(recipe.questions)} question(s) [{questions}], {output} output, "
            f"max_tokens {recipe.sampling.max_tokens}, model {recipe.model or '(pass --model)'}"
        )
    return code
