"""``mmbatch caption``: one JSON row per image, a caption or an error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from mmbatch.cli.common import (
    add_input_options,
    add_model_options,
    add_resume_options,
    engine_config_from,
    sampling_from,
    source_policy_from,
    url_policy_from,
)
from mmbatch.cli.jobs import Job, job_fingerprint, run_resumable
from mmbatch.cli.on_ray import add_ray_options, run_on_ray
from mmbatch.engine.base import Engine

DEFAULT_PROMPT = "Describe this image in one sentence."


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "caption",
        help="caption images: one JSON row per input item",
        description="Caption every image in INPUT (files, folders, globs, .jsonl/.csv "
        "manifests with a 'path' and optional 'id' and 'prompt'), or every row of one local "
        "Hugging Face dataset (a save_to_disk folder, Parquet files, an imagefolder with a "
        "metadata file, WebDataset tars).",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT")
    dataset = parser.add_argument_group("local datasets")
    dataset.add_argument(
        "--input-format",
        choices=("files", "disk", "parquet", "imagefolder", "webdataset"),
        default=None,
        help="how to read INPUT (default: detected; 'files' = images by path)",
    )
    dataset.add_argument(
        "--image-column", default=None, help="the dataset's image column (default: the only one)"
    )
    dataset.add_argument("--split", default=None, help="the dataset split (default: the only one)")
    dataset.add_argument("--id-column", default=None, help="row ids (default: the row index)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for each image")
    parser.add_argument("--system", default=None, help="system prompt (default: the model's)")
    parser.add_argument(
        "--max-pixels", type=int, default=None, help="downscale decoded images to at most this"
    )
    add_model_options(parser)
    add_ray_options(parser)
    add_resume_options(parser)
    add_input_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, make_engine: Callable[[], Engine] | None = None) -> int:
    """Caption ``args.inputs`` into ``args.out``. ``make_engine`` replaces the vLLM engine
    (the tests' fake engine goes through the same command this way)."""
    from mmbatch.config import ImageOptions
    from mmbatch.media.loader import MediaLoader
    from mmbatch.outputs import output_format

    # Everything that can be checked without the engine is checked before it starts.
    requests, unusable, summary = _inputs(args)
    engine_config = engine_config_from(args)
    out_format = output_format(args.out, args.out_format)
    image_options = ImageOptions(max_pixels=args.max_pixels)
    loader = MediaLoader(image_options, urls=url_policy_from(args))
    sampling = sampling_from(args)
    print(f"mmbatch: {len(requests) + len(unusable)} items, model {args.model}", file=sys.stderr)
    if args.ray is not None:
        summary |= {"model": args.model, "prompt": args.prompt, "output_format": out_format}
        # The Ray path writes its own output folder; it is not resumable (yet).
        return run_on_ray(
            args,
            requests,
            summary,
            engine_config=engine_config,
            sampling=sampling,
            image_options=image_options,
            out_format=out_format,
            unusable=unusable,
        )

    def make_vllm_engine() -> Engine:
        from mmbatch.engine.shared import shared_engine

        return shared_engine(engine_config, {"image": 1})

    job = Job(
        requests=requests,
        unusable=unusable,
        loader=loader,
        make_engine=make_engine or make_vllm_engine,
        sampling=sampling,
        fingerprint=job_fingerprint(
            "caption",
            args.model,
            sampling,
            prompt=args.prompt,
            system=args.system,
            image_options=asdict(image_options),
        ),
        summary=summary | {"model": args.model, "prompt": args.prompt, "output_format": out_format},
    )
    return run_resumable(args, job, out_format)


def _inputs(args: argparse.Namespace) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The requests, the dataset rows that cannot become one (as error rows), and what the
    summary records about the inputs (the gallery reopens a dataset from it)."""
    from mmbatch.errors import ConfigError
    from mmbatch.integrations.hf_local import DatasetInput, dataset_requests, detect_format
    from mmbatch.sources import image_requests

    fmt = args.input_format
    if fmt is None:
        detected = [found for found in map(detect_format, args.inputs) if found is not None]
        if detected and len(args.inputs) > 1:
            raise ConfigError("a dataset is read one at a time; name it alone as INPUT")
        fmt = detected[0] if detected else None
    if fmt in (None, "files"):
        if args.image_column or args.split or args.id_column:
            raise ConfigError("--image-column, --split and --id-column apply to datasets only")
        policy = source_policy_from(args)
        requests = image_requests(args.inputs, args.prompt, args.system, policy)
        return requests, [], {"inputs": list(args.inputs)}
    if len(args.inputs) != 1:
        raise ConfigError(f"a {fmt} dataset is read one at a time; got {len(args.inputs)} inputs")
    spec = DatasetInput(args.inputs[0], fmt, args.image_column, args.split, args.id_column)
    requests, unusable = dataset_requests(spec, args.prompt, args.system)
    return requests, unusable, {"inputs": list(args.inputs), "dataset": asdict(spec)}
