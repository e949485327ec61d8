"""``mmbatch run RECIPE INPUT... --out OUT``: a job described by a recipe file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from mmbatch.cli import ray
from mmbatch.cli.launch import engine_begun, launch
from mmbatch.cli.options import (
    Commands,
    add_engine_options,
    add_input_options,
    add_output_options,
    add_sampling_options,
    engine_args_from,
    engine_log_from,
    engine_log_shown_from,
    quiet_unless_verbose,
    sampling_from,
    source_policy_from,
    url_policy_from,
)

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine
    from mmbatch.engine.config import EngineConfig
    from mmbatch.jobs import Job
    from mmbatch.media.fetch import UrlPolicy
    from mmbatch.recipe.spec import Recipe
    from mmbatch.sources.files import SourcePolicy
    from mmbatch.types import Modality


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "run",
        help="run a recipe (recipes/*.toml) over inputs: one JSON row per item",
        description="Run the job a recipe describes over INPUT (files, folders, globs, "
        ".jsonl/.csv manifests). Each item's row holds every answer the recipe asks for.",
    )
    parser.add_argument("recipe", metavar="RECIPE", help="a recipe TOML file")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="what to run it over")
    parser.add_argument("--input", nargs=0, action=_OldInputFlag, help=argparse.SUPPRESS)
    add_output_options(parser)
    parser.add_argument("--model", default=None, help="overrides the recipe's [engine] model")
    add_sampling_options(parser, over="the recipe's [sampling]")
    add_engine_options(parser, "added to (and over) the recipe's [engine] table for vllm.LLM")
    ray.add_options(parser)
    add_input_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, engine: Engine | None = None) -> int:
    """Run ``args.recipe`` over ``args.inputs`` into ``args.out``, resumably; ``engine``
    replaces the vLLM engine the recipe describes (for the tests' fake engine)."""
    from dataclasses import replace

    from mmbatch.cli.describe import describe_recipe
    from mmbatch.engine.config import EngineConfig
    from mmbatch.errors import ConfigError
    from mmbatch.recipe import load_recipe

    # Everything that can be checked without the engine is checked before it starts.
    recipe = load_recipe(args.recipe)
    recipe = replace(recipe, sampling=sampling_from(args, recipe.sampling))
    model = args.model or recipe.model
    if not model:
        raise ConfigError(f"{args.recipe} names no model: set [engine] model or pass --model")
    kwargs = {**recipe.engine_kwargs(), **engine_args_from(args)}
    config = EngineConfig(
        model,
        kwargs,
        engine_log_from(args),
        "-v",
        gpus=args.gpus,
        log_shown=engine_log_shown_from(args),
        engines_per_gpu=args.engines_per_gpu,
    )
    guessed, size = _engine_guess(recipe, args.inputs) if engine is None else (None, None)
    # The vLLM engine is sized for what the recipe needs, which imports vLLM: before the
    # inputs are listed where its start may begin beside the listing (their size known at a
    # glance), else after, so that a mistake in them is said at once.
    fits = engine is None and not args.dry_run
    if fits and size is not None:
        config, fits = _fitted(recipe, config, args), False
    # The engine starts while the inputs are listed: the user waits for the longer.
    with engine_begun(args, config, guessed, size) as begun:
        job = recipe_job(
            recipe, args.inputs, model, source_policy_from(args), url_policy_from(args)
        )
        if fits:  # nothing was begun (``engine_begun`` begins only for a known size)
            begun = config = _fitted(recipe, config, args)
        if args.dry_run:
            print(describe_recipe(args.recipe, recipe, model))
        print(
            f"mmbatch: recipe {recipe.name}, {len(job.item_ids)} items x "
            f"{len(recipe.questions)} question(s), model {model}",
            file=sys.stderr,
        )
        on_ray = None if args.ray is None else partial(ray.run, args, engine=config, recipe=recipe)
        return launch(job, engine or begun, args, on_ray)


def _fitted(recipe: Recipe, config: EngineConfig, args: argparse.Namespace) -> EngineConfig:
    """``config`` sized for what ``recipe`` needs (``fit_engine``), what was changed said."""
    from mmbatch.recipe.fit import fit_engine

    with quiet_unless_verbose(args):
        config, note = fit_engine(recipe, config)
    if note is not None:
        print(f"mmbatch: {note}", file=sys.stderr)
    return config


def _engine_guess(
    recipe: Recipe, inputs: Sequence[str]
) -> tuple[dict[Modality, int] | None, int | None]:
    """The media a prompt of the recipe's job carries (one of what its [media] kind sends),
    and how many requests it has (None: not known), as the named inputs' names tell
    (``glance_at``), before they are listed: what its engine begins its start for. A
    picture or a whole clip is one item each; a video's frames and audio's windows are
    known only once listed."""
    from mmbatch.recipe.fit import request_modality
    from mmbatch.sources.glance import glance_at

    sends = request_modality(recipe)
    glance = glance_at(inputs)
    if glance.absent:
        return None, None  # the listing refuses the job: no engine is needed
    one_each = recipe.media.kind == sends  # a picture per picture, a clip per video
    items = glance.files({sends}) if one_each else None
    return {sends: 1}, items * len(recipe.questions) if items is not None else None


class _OldInputFlag(argparse.Action):
    """``--input`` before the inputs, as ``run`` once took them: still understood (the
    inputs that follow it are RECIPE's INPUT...), and said to be on its way out."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        print(
            "mmbatch: note: --input is no longer needed and will go: mmbatch run RECIPE "
            "INPUT... --out OUT",
            file=sys.stderr,
        )


def recipe_job(
    recipe: Recipe,
    inputs: Sequence[str],
    model: str,
    policy: SourcePolicy | None = None,
    urls: UrlPolicy | None = None,
) -> Job:
    """The job ``recipe`` describes over ``inputs``, run by ``model``: the requests, media
    options and row shape the recipe makes (``mmbatch.recipe.requests``), and what makes two
    runs the same job. Built here, by the face, so that a recipe knows nothing of the runner."""
    from dataclasses import asdict

    from mmbatch.jobs import Job, fingerprint
    from mmbatch.recipe.requests import recipe_media, recipe_requests, recipe_shape
    from mmbatch.sources.files import SourcePolicy
    from mmbatch.sources.log import ListingLog

    log = ListingLog()
    requests = recipe_requests(inputs, recipe, policy, log)
    return Job(
        requests,
        recipe.sampling,
        recipe_media(recipe, urls),
        recipe_shape(recipe),
        fingerprint=fingerprint(
            "run",
            model,
            recipe.sampling,
            questions=[asdict(q) for q in recipe.questions],
            system=recipe.system,
            media={"kind": recipe.media.kind, "options": dict(recipe.media.options)},
            output=asdict(recipe.output),
            keep_columns=(policy or SourcePolicy()).keep_columns,
        ),
        info={"inputs": list(inputs), "model": model, "recipe": recipe.path} | log.to_dict(),
        notes=log.lines(),
    )
