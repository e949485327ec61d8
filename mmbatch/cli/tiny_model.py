"""``mmbatch make-tiny-model``: offline model directories for tests, demos and benchmarks."""

from __future__ import annotations

import argparse

from mmbatch.cli.options import EXIT_OK, Commands
from mmbatch.tiny_models import FAMILIES, REAL_SHAPES


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "make-tiny-model",
        help="write a tiny random-weight model that vLLM loads (for offline tests and demos)",
    )
    parser.add_argument("directory")
    parser.add_argument(
        "--family",
        default="qwen2_vl",
        choices=FAMILIES,
        help="the model family (default qwen2_vl); docs/pages/tiny-models.md says what each takes",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--real-shape",
        metavar="NAME",
        default=None,
        choices=REAL_SHAPES,
        help="instead: a config-only directory at a real model's dimensions "
        "(for load_format=dummy benchmarks)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.tiny_models import build_tiny_model, write_real_shape

    if args.real_shape:
        path = write_real_shape(args.directory, args.real_shape)
        print(f"config-only {args.real_shape} directory (use load_format=dummy) in {path}")
    else:
        path = build_tiny_model(args.directory, family=args.family, seed=args.seed)
        print(f"tiny {args.family} model (seed {args.seed}) in {path}")
    return EXIT_OK
