"""``mmbatch run-openai-batch REQUESTS --model M --out RESULTS``: OpenAI batch files, offline."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mmbatch.cli.common import (
    add_engine_options,
    engine_config_from,
    report,
    run_config_from,
    run_into,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "run-openai-batch",
        help="run an OpenAI batch input file (chat completions) and write its output file",
        description="Read an OpenAI batch input file (/v1/chat/completions lines with text and "
        "image_url parts) and write the OpenAI batch output format, one line per request.",
    )
    parser.add_argument("requests", metavar="REQUESTS", help="the batch input .jsonl")
    parser.add_argument("--model", required=True, help="local model directory or hub name")
    parser.add_argument("--out", required=True, help="the batch output .jsonl")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="for lines that set neither max_tokens nor max_completion_tokens (default 1024)",
    )
    add_engine_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.config import ImageOptions
    from mmbatch.engine.shared import shared_engine
    from mmbatch.media.loader import MediaLoader
    from mmbatch.openai_batch import DEFAULT_MAX_TOKENS, OpenAIBatchRows, read_batch
    from mmbatch.sinks import JsonlSink
    from mmbatch.types import Sampling

    batch = read_batch(args.requests, args.max_tokens or DEFAULT_MAX_TOKENS)
    engine_config = engine_config_from(args)
    print(
        f"mmbatch: {len(batch.requests)} requests ({len(batch.refused)} refused), "
        f"model {args.model}",
        file=sys.stderr,
    )
    engine = shared_engine(engine_config, {"image": max(1, batch.max_images)})
    stats = run_into(
        JsonlSink(args.out),
        args.out,
        batch.requests,
        engine,
        MediaLoader(ImageOptions()),
        Sampling(),  # every line carries its own sampling
        run_config_from(args),
        OpenAIBatchRows(args.model),
        refused=batch.refused,
    )
    return report(stats, args.out, {"inputs": [args.requests], "model": args.model})
