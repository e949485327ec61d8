"""``mmbatch run-openai-batch REQUESTS --model M --out RESULTS``: OpenAI batch files, offline."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from mmbatch.cli.launch import engine_begun, launch
from mmbatch.cli.options import (
    Commands,
    add_engine_options,
    add_local_path_options,
    add_output_options,
    add_url_options,
    engine_config_from,
    local_paths_from,
    url_policy_from,
)

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.early import EngineStart
    from mmbatch.media.fetch import UrlPolicy
    from mmbatch.openai_batch.reader import BatchInput
    from mmbatch.sources.paths import LocalPaths
    from mmbatch.types import Modality


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "run-openai-batch",
        help="run an OpenAI batch input file (chat completions) and write its output file",
        description="Read an OpenAI batch input file (/v1/chat/completions lines with text and "
        "image_url parts) and write the OpenAI batch output format, one line per request.",
    )
    parser.add_argument("requests", metavar="REQUESTS", help="the batch input .jsonl")
    parser.add_argument("--model", required=True, help="local model directory or hub name")
    add_output_options(parser, formats=False)
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="for lines that set neither max_tokens nor max_completion_tokens (default 1024)",
    )
    add_engine_options(parser)
    safety = parser.add_argument_group("input safety")
    add_local_path_options(safety)
    add_url_options(safety)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, engine: Engine | None = None) -> int:
    from mmbatch.openai_batch.reader import DEFAULT_MAX_TOKENS, count_batch, read_batch

    config = engine_config_from(args)
    paths = local_paths_from(args)
    urls = url_policy_from(args)  # its bounds checked before the file is read
    size = count_batch(args.requests) if engine is None else None
    media: dict[Modality, int] | None = {"image": size.max_images} if size else None
    # The engine starts while the file is parsed (vLLM's request models, imported then,
    # take seconds of their own): the user waits for the longer, not for both.
    with engine_begun(args, config, media, size.lines if size else None) as begun:
        max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS
        batch = read_batch(args.requests, max_tokens, paths, allow_urls=urls is not None)
        return _run(args, batch, paths, urls, engine or begun)


def _run(
    args: argparse.Namespace,
    batch: BatchInput,
    paths: LocalPaths,
    urls: UrlPolicy | None,
    engine: Engine | EngineConfig | EngineStart,
) -> int:
    from mmbatch.jobs import Job, fingerprint
    from mmbatch.media.options import MediaOptions
    from mmbatch.openai_batch.writer import OpenAIBatchShape
    from mmbatch.types import Sampling

    sampling = Sampling()  # every line carries its own sampling
    job = Job(
        batch.requests,
        sampling,
        media=MediaOptions(urls=urls),
        shape=OpenAIBatchShape(args.model),
        fingerprint=fingerprint(
            "run-openai-batch", args.model, sampling, max_tokens=args.max_tokens
        ),
        info={"inputs": [args.requests], "model": args.model} | paths.record(),
    )
    print(
        f"mmbatch: {len(batch.requests)} requests ({batch.refused} refused), model {args.model}",
        file=sys.stderr,
    )
    return launch(job, engine, args)
