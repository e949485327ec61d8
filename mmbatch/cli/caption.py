"""``mmbatch caption``: one JSON row per image, a caption or an error."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mmbatch.cli.common import (
    add_model_options,
    engine_config_from,
    report,
    run_config_from,
    sampling_from,
)

DEFAULT_PROMPT = "Describe this image in one sentence."


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "caption",
        help="caption images: one JSON row per input item",
        description="Caption every image in INPUT (files, folders, globs, .jsonl/.csv "
        "manifests with a 'path' and optional 'id' and 'prompt').",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for each image")
    parser.add_argument("--system", default=None, help="system prompt (default: the model's)")
    parser.add_argument(
        "--max-pixels", type=int, default=None, help="downscale decoded images to at most this"
    )
    add_model_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.config import ImageOptions
    from mmbatch.engine.vllm import VLLMEngine
    from mmbatch.errors import FatalEngineError
    from mmbatch.media.loader import MediaLoader
    from mmbatch.pipeline import run_job
    from mmbatch.sinks import JsonlSink
    from mmbatch.sources import image_requests

    # Everything that can be checked without the engine is checked before it starts.
    requests = image_requests(args.inputs, args.prompt, args.system)
    sampling, run_config = sampling_from(args), run_config_from(args)
    engine_config = engine_config_from(args)
    loader = MediaLoader(ImageOptions(max_pixels=args.max_pixels))
    print(f"mmbatch: {len(requests)} items, model {args.model}", file=sys.stderr)
    engine = VLLMEngine(engine_config, {"image": 1})
    with JsonlSink(args.out) as sink:
        try:
            stats = run_job(requests, engine, loader, sink, sampling, run_config)
        except FatalEngineError as exc:
            sink.close()
            raise FatalEngineError(f"{exc}; rows finished so far are in {args.out}") from exc
    return report(stats, args.out)
