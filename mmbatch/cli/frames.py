"""``mmbatch frames``: one JSON row per sampled video frame, a caption or an error.

Frames of all the job's videos go through the same planner and engine as images do; each
video is indexed once (to know its frames) and its frames are decoded together.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from mmbatch.cli.launch import engine_begun, launch
from mmbatch.cli.options import (
    SAMPLING_FLAGS,
    Commands,
    add_input_options,
    add_model_options,
    add_prompt_options,
    add_video_options,
    engine_config_from,
    sampling_from,
    source_policy_from,
    video_options_from,
)
from mmbatch.sources import DEFAULT_PROMPTS
from mmbatch.words import counted

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.early import EngineStart
    from mmbatch.media.options import MediaOptions, VideoOptions
    from mmbatch.sources.files import SourcePolicy
    from mmbatch.sources.glance import Glance
    from mmbatch.types import Modality, Request, Sampling

DEFAULT_FRAME_PROMPT = DEFAULT_PROMPTS["frame"]
"""What ``mmbatch frames`` asks of each frame when it is given no ``--prompt``."""


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "frames",
        help="caption sampled video frames: one JSON row per frame",
        description="Sample frames from every VIDEO (files, folders, globs, manifests) and "
        "caption each; rows carry video, frame_index and pts (seconds). Without --model, "
        "only extract them: with --save-frames DIR the frames are written there and each "
        "row says where (frame_path); no engine is started.",
    )
    parser.add_argument("inputs", nargs="+", metavar="VIDEO")
    add_prompt_options(parser, DEFAULT_FRAME_PROMPT, "frame")
    parser.add_argument(
        "--save-frames", metavar="DIR", default=None, help="also write the frames as JPEG here"
    )
    add_video_options(parser, sampling_required=True)
    add_model_options(parser, without="only extract the frames")
    add_input_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, engine: Engine | None = None) -> int:
    from pathlib import Path

    from mmbatch.output.writable import check_folder_writable
    from mmbatch.sources.glance import glance_at

    # Everything that can be checked without the engine is checked before it starts.
    config = engine_config_from(args) if args.model is not None else None
    video = video_options_from(args)
    policy = source_policy_from(args)
    sampling = sampling_from(args)
    if config is None:
        return _listed(args, None, video, policy, sampling, engine)
    if args.save_frames is not None and not args.dry_run:  # said before an engine begins
        check_folder_writable(Path(args.save_frames), "the saved frames (--save-frames)")
    # The engine starts while the videos are indexed; each frame is a picture.
    glance = glance_at(args.inputs)
    absent = glance.absent  # the listing refuses the job: no engine needed
    guessed: dict[Modality, int] | None = None if engine is not None or absent else {"image": 1}
    with engine_begun(args, config, guessed, _frames_guess(glance, video)) as begun:
        return _listed(args, engine or begun, video, policy, sampling, engine)


def _frames_guess(glance: Glance, video: VideoOptions) -> int | None:
    """How many frames the videos seen give, where the sampling names them (so many a
    video, or at these times; a short video may give fewer); None where only indexing the
    videos tells (by rate, keyframes)."""
    each = {"num_frames": video.num_frames, "timestamps": len(video.timestamps)}
    videos = glance.files({"video"})
    per_video = each.get(video.sampling)
    return videos * per_video if videos is not None and per_video else None


def _listed(
    args: argparse.Namespace,
    engine: Engine | EngineConfig | EngineStart | None,
    video: VideoOptions,
    policy: SourcePolicy,
    sampling: Sampling,
    extractor: Engine | None,
) -> int:
    """The frames of the videos listed, then run on ``engine`` (None: no model, the frames
    only extracted, by ``extractor`` if given)."""
    from dataclasses import asdict

    from mmbatch.jobs import Job, fingerprint
    from mmbatch.media.options import MediaOptions
    from mmbatch.sources.log import ListingLog
    from mmbatch.sources.timeline import frame_requests

    log = ListingLog()
    requests = frame_requests(
        args.inputs, video, args.prompt, args.system, policy, log, save_dir=args.save_frames
    )
    media = MediaOptions(video=video, frame_dir=args.save_frames)
    info = {"inputs": list(args.inputs), "model": args.model, "prompt": args.prompt}
    info |= log.to_dict()
    if engine is None:
        return _extract(args, requests, media, info, extractor, log.lines())
    job = Job(
        requests,
        sampling,
        media,
        fingerprint=fingerprint(
            "frames",
            args.model,
            sampling,
            prompt=args.prompt,
            system=args.system,
            video_options=asdict(video),
            keep_columns=policy.keep_columns,
        ),
        info=info,
        notes=log.lines(),
    )
    print(f"mmbatch: {counted(len(job.item_ids), 'frame')}, model {args.model}", file=sys.stderr)
    return launch(job, engine, args)


def _extract(
    args: argparse.Namespace,
    requests: list[Request],
    media: MediaOptions,
    info: dict[str, Any],
    engine: Engine | None,
    notes: list[str],
) -> int:
    """Without a model: decode the frames (written to --save-frames) and list them, one row
    each (video, frame_index, pts, frame_path), starting no engine."""
    from dataclasses import asdict

    from mmbatch.engine.decode_only import DecodeOnly
    from mmbatch.errors import ConfigError
    from mmbatch.jobs import Job
    from mmbatch.output.rows import MEDIA_ONLY

    given = [flag for field, (flag, *_) in SAMPLING_FLAGS.items() if getattr(args, field)]
    if given or args.stop:
        raise ConfigError(f"{', '.join(given) or '--stop'}: sampling needs a --model")
    job = Job(
        requests,
        media=media,
        shape=MEDIA_ONLY,
        fingerprint={"command": "frames", "model": None, "video_options": asdict(media.video)},
        info=info,
        notes=notes,
    )
    where = f" to {media.frame_dir}" if media.frame_dir else " (add --save-frames DIR to keep them)"
    print(
        f"mmbatch: {counted(len(job.item_ids), 'frame')}, no model: extracting{where}",
        file=sys.stderr,
    )
    return launch(job, engine or DecodeOnly(), args)
