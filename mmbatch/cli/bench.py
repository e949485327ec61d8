"""``mmbatch bench``: naive vLLM against mmbatch on the same model, images and sampling."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from mmbatch.cli.options import EXIT_ITEMS_FAILED, EXIT_OK, Commands


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "bench",
        help="throughput benchmark: naive vLLM vs mmbatch, each side in its own process",
        description="Runs workloads W1 (distinct images), W2 (4 prompts per image, prompt-"
        "major), W3 (video frames at 1 fps) and W4 (30% repeated images) through a naive "
        "LLM.chat baseline, a prebuilt-input LLM.generate ceiling and mmbatch, and writes a "
        "JSON report with the ratios.",
    )
    parser.add_argument(
        "--model",
        required=True,
        help="model directory (or config-only, with --engine-arg load_format=dummy)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="the report's JSON file (default: mmbatch-bench-DATE-TIME.json in the working "
        "directory)",
    )
    _add_workload_options(parser)
    _add_whole_process_options(parser)
    _add_engine_options(parser)
    parser.set_defaults(handler=run)


SIZES: tuple[tuple[str, int, str | None], ...] = (
    ("--images", 500, "images of W2"),
    ("--w1-images", 2000, "images of W1, rows of W4"),
    ("--videos", 10, "videos of W3"),
    ("--video-seconds", 60, "length of W3's videos"),
    ("--size", 448, "image side in pixels"),
    ("--max-tokens", 128, None),
)
"""The workloads' sizes: each flag, its default and what it counts."""


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    """What each side runs: the workloads, their sizes and the sampling."""
    for flag, default, counts in SIZES:
        parser.add_argument(flag, type=int, default=default, help=counts)
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument(
        "--modes",
        default="naive,prebuilt,mmbatch",
        help="the sides, comma-separated: naive, prebuilt, mmbatch or a --variant's name; "
        "with --whole also ds-naive, ds-map, ds-pipelined, ds-whole (Hugging Face datasets), "
        "vllm-run-batch, openai-batch (and their -x4 forms: an OpenAI batch file), run (a "
        "recipe), frames, frames-naive (W3's videos), kept (a job on a kept engine), ray "
        "(`caption --ray` on a local one-node Ray) and ray-data-llm (Ray Data LLM's processor)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="every side's sampling temperature (default 0.7); 0 is greedy, mmbatch's own "
        "default, under which it answers identical requests (W4's repeats) once",
    )


def _add_whole_process_options(parser: argparse.ArgumentParser) -> None:
    """Whole processes timed from the command to its exit, and how the sides are run."""
    parser.add_argument(
        "--whole",
        default="",
        metavar="N,N",
        help="also time whole processes on N pictures each: `mmbatch caption` against a "
        "naive script, from the command to its exit (start-up, work and exit apart), and "
        "every whole-process side --modes names: run against naive, kept against mmbatch, "
        "frames against frames-naive over W3's videos (--videos of --video-seconds)",
    )
    parser.add_argument(
        "--whole-repeats", type=int, default=2, help="runs of each whole-process side"
    )
    parser.add_argument(
        "--decode-workers", type=int, default=None, help="the mmbatch side's decode processes"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="take a side's results from an earlier run in --work-dir instead of running it",
    )
    parser.add_argument("--work-dir", default=None, help="where images and specs go")


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine settings of both sides, of mmbatch's alone, and of extra sides."""
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for both sides (model shape, max_model_len, load_format)",
    )
    parser.add_argument(
        "--mmbatch-engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for the mmbatch side only (its tuning)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="an extra side, named in --modes: mmbatch's by default, e.g. r8='{\"render_threads\": "
        '8, "engine": {"max_num_batched_tokens": 32768}}\', one1=\'{"gpus": 1}\', '
        "inproc='{\"in_process\": true}', dw4='{\"decode_workers\": 4}', "
        'omp2=\'{"env": {"OMP_NUM_THREADS": 2}}\' (the side\'s environment); or a '
        "baseline's, e.g. "
        'tp2=\'{"side": "naive", "engine": {"tensor_parallel_size": 2}}\'; or a '
        "whole-process side's, e.g. "
        'rb512=\'{"side": "ray", "ray_batch": 512}\' (pictures per Ray actor batch)',
    )


def run(args: argparse.Namespace) -> int:
    from mmbatch.bench.driver import run_bench, table
    from mmbatch.cli.options import sampling_from
    from mmbatch.engine.config import parse_engine_args

    sampling_from(args)  # its sampling flags are checked, and worded, as a job's own are
    options = {
        "model": args.model,
        "temperature": args.temperature,
        "images": args.images,
        "size": args.size,
        "max_tokens": args.max_tokens,
        "workloads": [w.strip() for w in args.workloads.split(",") if w.strip()],
        "modes": [m.strip() for m in args.modes.split(",") if m.strip()],
        "seed": args.seed,
        "w1_images": args.w1_images,
        "videos": args.videos,
        "video_seconds": args.video_seconds,
        "decode_workers": args.decode_workers,
        "reuse": args.reuse,
        "work_dir": args.work_dir,
        "common_engine_args": parse_engine_args(args.engine_arg),
        "mmbatch_engine_args": parse_engine_args(args.mmbatch_engine_arg),
        "variants": parse_engine_args(args.variant),
        "whole": [int(n) for n in args.whole.split(",") if n.strip()],
        "whole_repeats": args.whole_repeats,
    }
    out = Path(args.out) if args.out else default_report_path()
    report = run_bench(options, sys.argv[1:], lambda so_far: write_report(out, so_far))
    write_report(out, report)
    print(table(report))
    print(f"report written to {out}")
    failed = [r for r in report.get("whole_process", {}).get("runs", []) if "failed_side" in r]
    if failed:
        sides = ", ".join(sorted({r["mode"] for r in failed}))
        print(f"bench: {len(failed)} whole-process run(s) failed ({sides}): see their logs")
        return EXIT_ITEMS_FAILED
    return EXIT_OK


def write_report(out: Path, report: dict[str, Any]) -> None:
    """``report`` at ``out``, whole or not at all: written beside it, then renamed over it,
    so that a bench stopped while saving leaves the last report it saved."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, out)


def default_report_path() -> Path:
    """Where a report goes unless ``--out`` says: the working directory, named by the time
    the run started (UTC), so that a later run never overwrites an earlier one's report."""
    started = datetime.datetime.now(datetime.timezone.utc)
    return Path(f"mmbatch-bench-{started:%Y-%m-%d-%H%M%S}.json")
