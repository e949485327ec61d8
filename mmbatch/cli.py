"""The ``mmbatch`` command. Imports of vllm, torch and transformers happen inside the
sub-command that needs them, so ``mmbatch --help`` answers at once.

Exit codes: 0 every item succeeded; 1 the job finished but some items failed (their rows say
why); 2 the job itself failed (bad arguments, unreadable inputs, a fatal engine error).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mmbatch.errors import MmbatchError

EXIT_OK, EXIT_ITEMS_FAILED, EXIT_JOB_FAILED = 0, 1, 2

DEFAULT_PROMPT = "Describe this image in one sentence."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmbatch",
        description="Multimodal batch captioning and extraction on vLLM's offline engine.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    caption = commands.add_parser(
        "caption",
        help="caption images: one JSON row per input item",
        description="Caption every image in INPUT (files, folders, globs, .jsonl/.csv "
        "manifests with a 'path' and optional 'id' and 'prompt').",
    )
    caption.add_argument("inputs", nargs="+", metavar="INPUT")
    caption.add_argument("--model", required=True, help="local model directory or hub name")
    caption.add_argument("--out", required=True, help="output JSONL file")
    caption.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for each image")
    caption.add_argument("--system", default=None, help="system prompt (default: the model's)")
    caption.add_argument("--max-tokens", type=int, default=128)
    caption.add_argument("--temperature", type=float, default=0.0)
    caption.add_argument("--seed", type=int, default=None, help="sampling seed")
    caption.add_argument(
        "--max-pixels", type=int, default=None, help="downscale decoded images to at most this"
    )
    caption.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to vllm.LLM untouched (VALUE parsed as JSON when it is JSON); repeatable",
    )
    caption.add_argument("--window", type=int, default=None, help="requests prepared together")
    caption.add_argument("--no-progress", action="store_true", help="no progress bar")
    caption.set_defaults(handler=_caption)

    tiny = commands.add_parser(
        "make-tiny-model",
        help="write a tiny random-weight model that vLLM loads (for offline tests and demos)",
    )
    tiny.add_argument("directory")
    tiny.add_argument(
        "--family", default="qwen2_vl", choices=("qwen2_vl", "qwen2_5_vl", "qwen2_audio")
    )
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--real-shape",
        metavar="NAME",
        default=None,
        help="instead: a config-only directory at a real model's dimensions "
        "(for load_format=dummy benchmarks), e.g. qwen2_5_vl_7b",
    )
    tiny.set_defaults(handler=_make_tiny_model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except MmbatchError as exc:
        print(f"mmbatch: error: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    return code


def _caption(args: argparse.Namespace) -> int:
    from mmbatch.config import EngineConfig, ImageOptions, RunConfig, parse_engine_args
    from mmbatch.engine.vllm import VLLMEngine
    from mmbatch.errors import FatalEngineError
    from mmbatch.media.loader import MediaLoader
    from mmbatch.pipeline import run_job
    from mmbatch.sinks import JsonlSink
    from mmbatch.sources import image_requests
    from mmbatch.types import Sampling

    requests = image_requests(args.inputs, args.prompt, args.system)
    sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    run = RunConfig(
        progress=not args.no_progress, **({"window": args.window} if args.window else {})
    )
    loader = MediaLoader(ImageOptions(max_pixels=args.max_pixels))
    engine_config = EngineConfig(args.model, parse_engine_args(args.engine_arg))
    print(f"mmbatch: {len(requests)} items, model {args.model}", file=sys.stderr)
    engine = VLLMEngine(engine_config, {"image": 1})
    with JsonlSink(args.out) as sink:
        try:
            stats = run_job(requests, engine, loader, sink, sampling, run)
        except FatalEngineError as exc:
            sink.close()
            raise FatalEngineError(f"{exc}; rows finished so far are in {args.out}") from exc
    print(stats.summary(), file=sys.stderr)
    print(f"rows written to {args.out}", file=sys.stderr)
    return EXIT_OK if stats.failed == 0 else EXIT_ITEMS_FAILED


def _make_tiny_model(args: argparse.Namespace) -> int:
    from mmbatch.tiny_models import build_tiny_model, write_real_shape

    if args.real_shape:
        path = write_real_shape(args.directory, args.real_shape)
        print(f"config-only {args.real_shape} directory (use load_format=dummy) in {path}")
    else:
        path = build_tiny_model(args.directory, family=args.family, seed=args.seed)
        print(f"tiny {args.family} model (seed {args.seed}) in {path}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
