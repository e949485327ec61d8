"""Options and the job runner shared by the commands that read video and audio.

``add_video_options`` / ``add_audio_options`` declare the sampling flags once, so
``mmbatch frames`` and ``mmbatch caption --as-clip`` spell them the same way; ``run_requests``
builds the engine for exactly the modalities the requests carry, measures prompts against
it (the pre-flight budget), and writes one row per request.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from mmbatch.cli.common import (
    engine_config_from,
    report,
    run_config_from,
    run_into,
    sampling_from,
)
from mmbatch.types import Modality


def add_video_options(parser: argparse.ArgumentParser, *, sampling_required: bool) -> None:
    """How frames are sampled: one of --fps, --num-frames, --keyframes, --timestamps."""
    group = parser.add_argument_group("video sampling")
    how = group.add_mutually_exclusive_group(required=sampling_required)
    how.add_argument("--fps", type=float, help="frames per second of video")
    how.add_argument("--num-frames", type=int, help="this many frames, spread evenly")
    how.add_argument("--keyframes", action="store_true", help="every key frame")
    how.add_argument(
        "--timestamps", help="frames shown at these times, in seconds (comma-separated)"
    )
    group.add_argument(
        "--max-frames", type=int, default=None, help="cap on the frames taken from one video"
    )
    group.add_argument(
        "--min-frames",
        type=int,
        default=None,
        help="a clip too long for the model may be cut down to this many frames",
    )
    group.add_argument(
        "--min-pixels",
        type=int,
        default=None,
        help="a clip too large for the model may have its frames shrunk down to this many pixels",
    )


def video_options_from(args: argparse.Namespace) -> Any:
    from mmbatch.config import DEFAULT_MAX_FRAMES, VideoOptions
    from mmbatch.errors import ConfigError

    common: dict[str, Any] = {
        "max_frames": args.max_frames or DEFAULT_MAX_FRAMES,
        "max_pixels": args.max_pixels,
        "min_frames": args.min_frames,
        "min_pixels": args.min_pixels,
    }
    if args.fps is not None:
        return VideoOptions(sampling="fps", fps=args.fps, **common)
    if args.keyframes:
        return VideoOptions(sampling="keyframes", **common)
    if args.timestamps:
        try:
            times = tuple(float(t) for t in args.timestamps.split(",") if t.strip())
        except ValueError:
            raise ConfigError(f"--timestamps {args.timestamps!r}: not numbers") from None
        return VideoOptions(sampling="timestamps", timestamps=times, **common)
    if args.num_frames is not None:
        return VideoOptions(sampling="num_frames", num_frames=args.num_frames, **common)
    return VideoOptions(**common)


def add_audio_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("audio")
    group.add_argument(
        "--sample-rate", type=int, default=None, help="resample to this (default: the model's)"
    )
    group.add_argument(
        "--audio-window", type=float, default=30.0, help="seconds per window of long audio"
    )
    group.add_argument(
        "--audio-overlap", type=float, default=0.0, help="seconds shared by adjacent windows"
    )


def audio_options_from(args: argparse.Namespace, sample_rate: int | None = None) -> Any:
    from mmbatch.config import DEFAULT_SAMPLE_RATE, AudioOptions

    rate = args.sample_rate or sample_rate or DEFAULT_SAMPLE_RATE
    return AudioOptions(rate, args.audio_window, args.audio_overlap)


def model_modalities(engine_config: Any) -> frozenset[Modality]:
    """The media the model's processor takes (image, video, audio), read before the engine
    starts so that a folder is walked for what the model can use."""
    from transformers import AutoProcessor

    from mmbatch.errors import ConfigError

    trust = bool(engine_config.engine_kwargs.get("trust_remote_code", False))
    try:
        processor = AutoProcessor.from_pretrained(engine_config.model, trust_remote_code=trust)
    except Exception as exc:
        raise ConfigError(f"cannot load the processor of {engine_config.model!r}: {exc}") from exc
    parts: dict[Modality, str] = {
        "image": "image_processor",
        "video": "video_processor",
        "audio": "feature_extractor",
    }
    return frozenset(m for m, attr in parts.items() if getattr(processor, attr, None) is not None)


def run_requests(
    args: argparse.Namespace,
    requests: Sequence[Any],
    *,
    unusable: Sequence[tuple[Any, Any]] = (),
    job: dict[str, Any] | None = None,
    **loader_kwargs: Any,
) -> int:
    """Start the engine for the media ``requests`` carry and run them into ``args.out``.

    ``unusable`` are (request, failure) pairs found before any loading (dataset rows that
    cannot become a request): their error rows are written first and counted in the stats.
    The loader measures every prompt against the engine (the pre-flight budget)."""
    from mmbatch.config import ImageOptions
    from mmbatch.engine.shared import shared_engine
    from mmbatch.media.loader import MediaLoader
    from mmbatch.media_sources import modalities_in
    from mmbatch.outputs import open_sink, output_format
    from mmbatch.rows import Row
    from mmbatch.sinks import output_row

    sampling, run_config = sampling_from(args), run_config_from(args)
    engine_config = engine_config_from(args)
    out_format = output_format(args.out, args.out_format)
    total = len(requests) + len(unusable)
    print(f"mmbatch: {total} items, model {args.model}", file=sys.stderr)
    engine = shared_engine(engine_config, modalities_in(requests) or {"image": 1})
    budget = engine.prompt_budget()
    if "audio_options" in loader_kwargs and args.sample_rate is None and budget.audio:
        loader_kwargs["audio_options"] = audio_options_from(args, budget.audio.sample_rate)
    loader = MediaLoader(ImageOptions(max_pixels=args.max_pixels), budget=budget, **loader_kwargs)
    refused = [Row(failure, output_row(request, (), failure)) for request, failure in unusable]
    sink = open_sink(args.out, out_format)
    stats = run_into(
        sink, args.out, requests, engine, loader, sampling, run_config, refused=refused
    )
    return report(stats, args.out, (job or {}) | {"output_format": out_format})
