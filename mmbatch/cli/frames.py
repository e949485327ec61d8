"""``mmbatch frames``: one JSON row per sampled video frame, a caption or an error.

Frames of all the job's videos go through the same windows, planner and engine as images
do; each video is indexed once (to know its frames) and decoded once per window for all of
its frames there.
"""

from __future__ import annotations

import argparse
from typing import Any

from mmbatch.cli.common import add_model_options
from mmbatch.cli.media import add_video_options, run_requests, video_options_from

DEFAULT_PROMPT = "Describe this video frame in one sentence."


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "frames",
        help="caption sampled video frames: one JSON row per frame",
        description="Sample frames from every VIDEO (files, folders, globs, manifests) and "
        "caption each; rows carry video, frame_index and pts (seconds).",
    )
    parser.add_argument("inputs", nargs="+", metavar="VIDEO")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for each frame")
    parser.add_argument("--system", default=None, help="system prompt (default: the model's)")
    parser.add_argument(
        "--max-pixels", type=int, default=None, help="downscale frames to at most this"
    )
    parser.add_argument(
        "--save-frames", metavar="DIR", default=None, help="also write the frames as JPEG here"
    )
    add_video_options(parser, sampling_required=True)
    add_model_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mmbatch.media_sources import frame_requests

    # Everything that can be checked without the engine is checked before it starts.
    options = video_options_from(args)
    requests = frame_requests(args.inputs, options, args.prompt, args.system)
    job = {"inputs": list(args.inputs), "model": args.model, "prompt": args.prompt}
    return run_requests(args, requests, job=job, video_options=options, frame_dir=args.save_frames)
