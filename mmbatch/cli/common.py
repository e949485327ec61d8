"""Options and steps shared by the sub-commands that run a model."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_ITEMS_FAILED, EXIT_JOB_FAILED = 0, 1, 2


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--model, --out, sampling and engine options, the same for every job command."""
    parser.add_argument("--model", required=True, help="local model directory or hub name")
    parser.add_argument(
        "--out",
        required=True,
        help="output: a JSONL file, a .parquet file, or a datasets folder (--out-format)",
    )
    parser.add_argument(
        "--out-format",
        choices=("jsonl", "parquet", "datasets"),
        default=None,
        help="default: parquet for a .parquet --out, else jsonl; datasets = save_to_disk folder",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    add_engine_options(parser)


def add_engine_options(
    parser: argparse.ArgumentParser,
    engine_help: str = "passed to vllm.LLM untouched (VALUE parsed as JSON when it is JSON)",
) -> None:
    """--engine-arg, --window and --no-progress: how any job command drives the engine."""
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{engine_help}; repeatable",
    )
    parser.add_argument("--window", type=int, default=None, help="requests prepared together")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the model repository run its own Python code (off by default)",
    )


def add_resume_options(parser: argparse.ArgumentParser) -> None:
    """--retry-errors and --force: how a rerun treats the rows already in --out."""
    resume = parser.add_argument_group(
        "resuming", "rerun the same command with the same --out to continue a stopped job"
    )
    resume.add_argument(
        "--retry-errors", action="store_true", help="redo the items whose row is an error"
    )
    resume.add_argument(
        "--force",
        action="store_true",
        help="append to an --out written with other settings (model, prompt, sampling, decode)",
    )


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """What inputs may point at: the manifest root and URLs."""
    from mmbatch.media.fetch import DEFAULT_URL_MAX_BYTES, DEFAULT_URL_TIMEOUT_S

    group = parser.add_argument_group("input safety")
    group.add_argument(
        "--input-root",
        default=None,
        metavar="DIR",
        help="manifest paths must resolve inside DIR (default: the manifest's folder)",
    )
    group.add_argument(
        "--allow-outside-root", action="store_true", help="let manifest paths leave the root"
    )
    group.add_argument("--allow-urls", action="store_true", help="fetch http(s) inputs")
    group.add_argument(
        "--url-max-bytes",
        type=int,
        default=DEFAULT_URL_MAX_BYTES,
        help="largest download per URL (default %(default)s)",
    )
    group.add_argument(
        "--url-timeout",
        type=float,
        default=DEFAULT_URL_TIMEOUT_S,
        help="seconds allowed per URL (default %(default)s)",
    )


def source_policy_from(args: argparse.Namespace) -> Any:
    from mmbatch.sources import SourcePolicy

    return SourcePolicy(args.input_root, args.allow_outside_root, args.allow_urls)


def url_policy_from(args: argparse.Namespace) -> Any:
    from mmbatch.media.fetch import UrlPolicy

    return UrlPolicy(args.url_max_bytes, args.url_timeout) if args.allow_urls else None


def sampling_from(args: argparse.Namespace) -> Any:
    from mmbatch.types import Sampling

    return Sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)


def run_config_from(args: argparse.Namespace) -> Any:
    from mmbatch.config import RunConfig

    window = {"window": args.window} if args.window else {}
    return RunConfig(progress=not args.no_progress, **window)


def engine_args_from(args: argparse.Namespace) -> dict[str, Any]:
    """The --engine-arg pairs, with --trust-remote-code when it was given."""
    from mmbatch.config import parse_engine_args

    engine_args = parse_engine_args(args.engine_arg)
    if args.trust_remote_code:
        engine_args["trust_remote_code"] = True
    return engine_args


def engine_config_from(args: argparse.Namespace) -> Any:
    from mmbatch.config import EngineConfig

    return EngineConfig(args.model, engine_args_from(args))


def run_into(
    sink: Any,
    out: str,
    requests: Any,
    engine: Any,
    loader: Any,
    sampling: Any,
    run: Any,
    rows: Any = None,
    refused: Sequence[Any] = (),
) -> Any:
    """Run the job into ``sink`` (writing ``out``) and close it; a fatal engine error says
    where the rows finished so far are.

    ``refused`` rows (``Row``s of inputs turned down while reading, before the job) are
    written first and counted in the stats like every other row."""
    from mmbatch.errors import FatalEngineError
    from mmbatch.pipeline import run_job

    try:
        for row in refused:
            sink.write(row.data)
        stats = run_job(requests, engine, loader, sink, sampling, run, rows)
    except FatalEngineError as exc:
        sink.close()
        raise FatalEngineError(f"{exc}; rows finished so far are in {out}") from exc
    sink.close()
    stats.total += len(refused)
    for row in refused:
        stats.record(row.outcome)
    return stats


def report(stats: Any, out: str, job: dict[str, Any] | None = None) -> int:
    """Print the summary, write it beside the output, and turn the stats into the exit code."""
    from mmbatch.outputs import write_summary

    print(stats.summary(), file=sys.stderr)
    summary = write_summary(out, stats.to_dict(), job or {})
    print(f"rows written to {out}, summary to {summary}", file=sys.stderr)
    return EXIT_OK if stats.failed == 0 else EXIT_ITEMS_FAILED
