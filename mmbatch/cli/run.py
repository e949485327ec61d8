"""``mmbatch run RECIPE --input ... --out ...``: a job described by a recipe file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from mmbatch.cli.common import (
    add_engine_options,
    add_input_options,
    add_resume_options,
    engine_args_from,
    source_policy_from,
    url_policy_from,
)
from mmbatch.cli.jobs import Job, job_fingerprint, run_resumable
from mmbatch.cli.on_ray import add_ray_options, run_on_ray
from mmbatch.engine.base import Engine


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="run a recipe (recipes/*.toml) over inputs: one JSON row per item",
        description="Run the job a recipe describes over INPUT (files, folders, globs, "
        ".jsonl/.csv manifests). Each item's row holds every answer the recipe asks for.",
    )
    parser.add_argument("recipe", metavar="RECIPE", help="a recipe TOML file")
    parser.add_argument("--input", nargs="+", required=True, metavar="INPUT", dest="inputs")
    parser.add_argument("--out", required=True, help="output JSONL file")
    parser.add_argument("--model", default=None, help="overrides the recipe's [engine] model")
    add_engine_options(parser, "added to (and over) the recipe's [engine] table for vllm.LLM")
    add_ray_options(parser)
    add_resume_options(parser)
    add_input_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, make_engine: Callable[[], Engine] | None = None) -> int:
    """Run ``args.recipe`` over ``args.inputs`` into ``args.out``, resumably. ``make_engine``
    replaces the vLLM engine (for the tests' fake engine)."""
    from mmbatch.config import EngineConfig
    from mmbatch.errors import ConfigError
    from mmbatch.media_sources import modalities_in
    from mmbatch.recipe import load_recipe
    from mmbatch.recipe_job import image_options, recipe_loader, recipe_requests, recipe_rows

    # Everything that can be checked without the engine is checked before it starts.
    recipe = load_recipe(args.recipe)
    model = args.model or recipe.model
    if not model:
        raise ConfigError(f"{args.recipe} names no model: set [engine] model or pass --model")
    requests = recipe_requests(args.inputs, recipe, source_policy_from(args))
    rows = recipe_rows(recipe, requests)
    loader = recipe_loader(recipe, url_policy_from(args))
    engine_config = EngineConfig(model, {**recipe.engine_kwargs(), **engine_args_from(args)})
    items = len({r.row_id for r in requests})
    print(
        f"mmbatch: recipe {recipe.name}, {items} items x {len(recipe.questions)} "
        f"question(s), model {model}",
        file=sys.stderr,
    )
    if args.ray is not None:
        # One input row per item on Ray: each actor asks the item's questions itself.
        first_asks: dict[str, Any] = {}
        for request in requests:
            first_asks.setdefault(request.row_id, request)
        item_rows = [
            replace(r, id=r.row_id, item_id=None, output=None) for r in first_asks.values()
        ]
        summary = {"inputs": list(args.inputs), "model": model, "recipe": recipe.path}
        return run_on_ray(
            args,
            item_rows,
            summary,
            engine_config=engine_config,
            sampling=recipe.sampling,
            image_options=image_options(recipe),
            recipe=recipe,
        )

    def make_vllm_engine() -> Engine:
        from mmbatch.engine.shared import shared_engine

        engine = shared_engine(engine_config, modalities_in(requests) or {recipe.media.kind: 1})
        # Prompts are measured against this engine before they are sent (and clips shrunk).
        loader.budget = engine.prompt_budget()
        return engine

    job = Job(
        requests=requests,
        loader=loader,
        make_engine=make_engine or make_vllm_engine,
        sampling=recipe.sampling,
        rows=rows,
        fingerprint=job_fingerprint(
            "run",
            model,
            recipe.sampling,
            questions=[asdict(q) for q in recipe.questions],
            system=recipe.system,
            media={"kind": recipe.media.kind, "options": dict(recipe.media.options)},
            output=asdict(recipe.output),
        ),
        summary={"inputs": list(args.inputs), "model": model, "recipe": recipe.path},
    )
    return run_resumable(args, job, "jsonl")
