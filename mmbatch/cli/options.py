"""The options every job command shares, declared once, and what they turn into.

``add_*`` declare a group of flags; ``*_from(args)`` turn the parsed flags into mmbatch's own
settings. Nothing heavy is imported at module level (``mmbatch --help`` stays instant):
each builder imports what it makes when it is called.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.media.fetch import UrlPolicy
    from mmbatch.media.options import AudioOptions, VideoOptions
    from mmbatch.output.file_output import FileOutput
    from mmbatch.pipeline import RunConfig
    from mmbatch.sources.clips import ClipSplit
    from mmbatch.sources.files import KeepColumns, SourcePolicy
    from mmbatch.sources.paths import LocalPaths
    from mmbatch.types import Sampling

EXIT_OK, EXIT_ITEMS_FAILED, EXIT_JOB_FAILED = 0, 1, 2
EXIT_INTERRUPTED = 130
"""Ctrl-C, as a shell reports a process that SIGINT ended: the job resumes where it stopped."""
EXIT_TERMINATED = 143
"""SIGTERM (``timeout``, a batch scheduler, ``kill``), stopped as Ctrl-C stops a job."""

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What each command module's ``register`` adds its parser to."""


def add_prompt_options(parser: argparse.ArgumentParser, default: str | None, item: str) -> None:
    """--prompt, --system, --max-pixels and --max-source-pixels: what is asked of each
    ``item`` (``default``; None: each kind of media's own, ``DEFAULT_PROMPTS``), and how large
    its pictures may be."""
    from mmbatch.media.options import DEFAULT_MAX_IMAGE_PIXELS
    from mmbatch.sources import DEFAULT_PROMPTS

    said = (
        f'"{default}"' if default else ", ".join(f'{k}: "{v}"' for k, v in DEFAULT_PROMPTS.items())
    )
    parser.add_argument(
        "--prompt",
        default=default,
        help=f"the question for each {item} (default: {said})".replace("%", "%%"),
    )
    parser.add_argument("--system", default=None, help="system prompt (default: the model's)")
    parser.add_argument(
        "--max-pixels", type=int, default=None, help=f"downscale each {item} to at most this"
    )
    parser.add_argument(
        "--max-source-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="refuse, before decoding, pictures and video frames larger than this "
        "(default %(default)s)",
    )


MEDIA_FLAGS: dict[str, tuple[str, str, Any]] = {
    "fps": ("--fps", "video", None),
    "num_frames": ("--num-frames", "video", None),
    "keyframes": ("--keyframes", "video", False),
    "timestamps": ("--timestamps", "video", None),
    "max_frames": ("--max-frames", "video", None),
    "min_frames": ("--min-frames", "video", None),
    "min_pixels": ("--min-pixels", "video", None),
    "as_clip": ("--as-clip", "video", False),
    "clip_seconds": ("--clip-seconds", "video", None),
    "stride": ("--stride", "video", None),
    "scenes": ("--scenes", "video", False),
    "clip_frame": ("--clip-frame", "video", None),
    "sample_rate": ("--sample-rate", "audio", None),
    "audio_window": ("--audio-window", "audio", 30.0),
    "audio_overlap": ("--audio-overlap", "audio", 0.0),
}
"""The flags that shape how one kind of media is read: each flag's attribute, its spelling,
the kind it affects and its default (a flag left at it was not given)."""


def unused_flag_warnings(args: argparse.Namespace, kinds: set[str]) -> list[str]:
    """One line per kind of media a given flag affects that none of the job's items is
    (``--fps`` on a folder of pictures), so that a flag with no effect is not silently
    ignored; ``kinds``: the media the job's items hold."""
    unused: dict[str, list[str]] = {}
    for name, (flag, kind, default) in MEDIA_FLAGS.items():
        if kind not in kinds and getattr(args, name, default) != default:
            unused.setdefault(kind, []).append(flag)
    lines = []
    for kind, flags in unused.items():
        one = len(flags) == 1
        said = f"{', '.join(flags)} {'has' if one else 'have'} no effect"
        item = "a video" if kind == "video" else "audio"
        lines.append(
            f"mmbatch: warning: {said}: {'it applies' if one else 'they apply'} to {kind}, "
            f"and none of the inputs is {item}"
        )
    return lines


def add_model_options(parser: argparse.ArgumentParser, without: str | None = None) -> None:
    """--model, --out, sampling and engine options, the same for every job command;
    ``without`` says what the command does without a model (None: --model is required)."""
    help = "local model directory or hub name" + (f" (without: {without})" if without else "")
    parser.add_argument("--model", required=without is None, help=help)
    add_output_options(parser)
    add_sampling_options(parser)
    add_engine_options(parser)


SAMPLING_FLAGS = {
    "max_tokens": ("--max-tokens", int, "most tokens per answer (default 128)"),
    "temperature": ("--temperature", float, "0 (the default) is greedy"),
    "top_p": ("--top-p", float, "nucleus sampling, in (0, 1]"),
    "top_k": ("--top-k", int, "sample from the k likeliest tokens (0: all)"),
    "min_p": ("--min-p", float, "drop tokens below this share of the likeliest, in [0, 1]"),
    "repetition_penalty": ("--repetition-penalty", float, "above 1 discourages repeats"),
    "presence_penalty": ("--presence-penalty", float, "in [-2, 2]"),
    "frequency_penalty": ("--frequency-penalty", float, "in [-2, 2]"),
    "n": ("--n", int, "completions per item; above 1, a row's text is a list of them"),
    "seed": ("--seed", int, "sampling seed"),
}
"""Sampling settings as flags: ``Sampling``'s field -> (flag, type, help)."""


def add_sampling_options(parser: argparse.ArgumentParser, over: str | None = None) -> None:
    """The sampling flags; each left out takes the job's default (``over`` names where that
    comes from, e.g. a recipe's [sampling]), else the model's generation_config."""
    group = parser.add_argument_group(
        "sampling",
        "settings left out take "
        + (f"{over}, else " if over else "")
        + "the model's generation_config (e.g. its repetition penalty), else vLLM's defaults",
    )
    for field, (flag, kind, help) in SAMPLING_FLAGS.items():
        group.add_argument(flag, dest=field, type=kind, default=None, metavar="N", help=help)
    group.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop the answer at TEXT (left out of it); repeatable",
    )


def add_output_options(parser: argparse.ArgumentParser, formats: bool = True) -> None:
    """--out (and --out-format), and how a rerun treats the rows already there."""
    if formats:
        parser.add_argument(
            "--out",
            default=None,
            type=folder_or_store,
            help="output: a JSONL file, a .parquet file, or a datasets folder (--out-format); "
            "local, or in object storage (s3://bucket/prefix/out.jsonl); required but with "
            "--dry-run",
        )
        parser.add_argument(
            "--out-format",
            choices=("jsonl", "parquet", "datasets", "webdataset"),
            default=None,
            help="default: parquet for a .parquet --out, else jsonl; datasets = save_to_disk "
            "folder; webdataset = a folder of tar shards (media, .json and .txt per item)",
        )
        parser.add_argument(
            "--shard-rows",
            type=int,
            default=None,
            metavar="N",
            help="parquet, webdataset: --out is a folder of shards of N rows (webdataset: "
            "10000 by default)",
        )
    else:
        parser.add_argument(
            "--out",
            default=None,
            type=folder_or_store,
            help="the output .jsonl; required but with --dry-run",
        )
    add_trial_options(parser)
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
    resume.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh and replace --out once this job has finished (until then the old "
        "output stays as it was; an interrupted run goes on when run again)",
    )


def add_trial_options(parser: argparse.ArgumentParser) -> None:
    """--limit and --dry-run: a small or an empty run before the whole job, on every job
    command (``launch`` applies them, for every command alike)."""
    group = parser.add_argument_group("trials", "try a job before running all of it")
    group.add_argument(
        "--limit",
        type=_positive,
        default=None,
        metavar="N",
        help="run only the first N items, in listing order; the same command without "
        "--limit later keeps their rows and runs the rest",
    )
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="say what the job would do (the items, what is passed over and why, the plan, "
        "the token budget, the engines) and stop: no engine, no output",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a count of items (1 or more): {text!r}")
    return value


def add_engine_options(
    parser: argparse.ArgumentParser,
    engine_help: str = "passed to vllm.LLM untouched (VALUE parsed as JSON when it is JSON)",
) -> None:
    """--engine, --engine-arg, --window and --no-progress: how any job command drives the
    engine."""
    parser.add_argument(
        "--engine",
        default=None,
        metavar="NAME",
        help="run on the kept engine NAME (mmbatch engine start) instead of starting one",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{engine_help}; repeatable",
    )
    parser.add_argument(
        "--decode-workers",
        type=int,
        default=None,
        metavar="N",
        help="processes decoding media (default: one per core beyond two, at most 8; 0: a "
        "thread of this process)",
    )
    parser.add_argument(
        "--memory-budget",
        type=_size,
        default=None,
        metavar="SIZE",
        help="media held in memory at once, e.g. 4G or 512M (default: an eighth of RAM, "
        "at most 16G)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_gpu_options(parser)
    add_terminal_options(parser)


def _add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """How the engines use the host's GPUs, what the model may run, and batch invariance."""
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="use N of the visible GPUs (default: all): one engine per GPU when the model "
        "fits one, else the fewest GPUs that hold it per engine",
    )
    parser.add_argument(
        "--engines-per-gpu",
        type=int,
        default=None,
        metavar="K",
        help="run K engines on each GPU, each with 1/K of its memory (default: 1): more "
        "than one when vLLM's engine-core thread, not the GPU, bounds a small model",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the model repository run its own Python code (off by default)",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="answers that do not depend on what they are batched with (vLLM's "
        "VLLM_BATCH_INVARIANT=1), so a resumed or Ray job writes the texts of one "
        "uninterrupted run; slower; NVIDIA GPUs of compute capability 9.0+ (8.0+ from vLLM "
        "0.32) only",
    )


def add_terminal_options(parser: argparse.ArgumentParser) -> None:
    """-v, -q and --json: what a job command shows on the terminal (``terminal_for``)."""
    shown = parser.add_mutually_exclusive_group()
    add_verbose_option(shown)
    shown.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only the summary's last line (rows ok and failed, where the summary is) "
        "and errors; no progress bar",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the summary (OUT.summary.json's object) on stdout, as one JSON object; "
        "nothing else goes to stdout",
    )


def add_verbose_option(
    parser: argparse._ActionsContainer,
    where: str = "by default they go to OUT.vllm.log",
) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=f"show vLLM's log and what other libraries say ({where})",
    )


def engine_log_from(args: argparse.Namespace) -> str | None:
    """Where vLLM's log (and what other libraries say) goes: beside ``--out``
    (``OUT.vllm.log``; for an output in storage, beside its local mirror, and uploaded beside
    it when the job ends), or with ``-v`` the terminal (None)."""
    from mmbatch.output.paths import OutputPaths
    from mmbatch.output.target import local_rows

    if args.verbose or args.out is None:  # with no --out, a dry run: no engine, no log
        return None
    return str(OutputPaths(local_rows(args.out)).vllm_log)


def engine_log_shown_from(args: argparse.Namespace) -> str | None:
    """Where the person running the job finds vLLM's log (``engine_log_from``) when that is
    not where it is written: for an output in storage, the URL beside the output that the
    log is uploaded to when the job ends (the local mirror is removed then)."""
    from mmbatch.output.paths import OutputPaths
    from mmbatch.output.remote import RemoteOutput, staging
    from mmbatch.output.target import in_store
    from mmbatch.storage.urls import shown

    if args.verbose or args.out is None or not in_store(args.out):
        return None
    url = args.out.rstrip("/")
    try:
        mirror = RemoteOutput(url, staging(url))
        return shown(mirror.remote(OutputPaths(mirror.local).vllm_log))
    except ValueError:  # a URL no output can be at: the output's own check says why
        return None


@contextmanager
def quiet_unless_verbose(args: argparse.Namespace) -> Iterator[None]:
    """What vLLM prints while a command reads the model's configuration (no engine, no
    log file), dropped unless ``-v``."""
    from mmbatch.engine.logs import engine_log

    with engine_log(None if args.verbose else os.devnull):
        yield


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """What inputs may point at: the manifest root and URLs."""
    group = parser.add_argument_group("input safety")
    add_local_path_options(group)
    add_url_options(group)
    parser.add_argument(
        "--keep-columns",
        default=None,
        metavar="COLS",
        help="input columns copied into each row: a,b,c, all or none (default: all for a "
        "dataset, none for a manifest); one named like a field of the row becomes input_NAME",
    )


def add_local_path_options(group: argparse._ActionsContainer) -> None:
    """Where the paths named inside an input (a manifest, a batch file, a dataset) may lead:
    the one rule of ``mmbatch.sources.paths``."""
    group.add_argument(
        "--input-root",
        action="append",
        default=[],
        type=folder_or_store,
        metavar="DIR",
        help="paths named inside an input (manifest, batch file, dataset) may also lead into "
        "DIR, a folder or a storage prefix (s3://bucket/prefix); repeatable (default: only "
        "into the input's own folder or prefix)",
    )
    group.add_argument(
        "--allow-outside-root",
        action="store_true",
        help="let paths named inside an input lead anywhere",
    )


def folder_or_store(text: str) -> str:
    """``text``, a place the job writes to or reads under (``--out``, ``--input-root``), if
    it is a local path or a URL of a store: any other URL is refused as the command's
    mistake, before anything runs (``mmbatch.storage.urls.unsupported_folder``)."""
    from mmbatch.storage.urls import unsupported_folder

    refusal = unsupported_folder(text)
    if refusal is not None:
        raise argparse.ArgumentTypeError(refusal)
    return text


def add_url_options(group: argparse._ActionsContainer) -> None:
    """Whether http(s) URLs named in the inputs are fetched, and within which bounds
    (``url_policy_from``): one set of options for every command that reads them."""
    from mmbatch.media.fetch import DEFAULT_URL_MAX_BYTES, DEFAULT_URL_TIMEOUT_S

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


def local_paths_from(args: argparse.Namespace) -> LocalPaths:
    from mmbatch.sources.paths import LocalPaths

    return LocalPaths(tuple(args.input_root), args.allow_outside_root)


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
        "--max-frames",
        type=int,
        default=None,
        help="cap on the frames taken from one video (default: 64 for a clip, none for frames)",
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


def add_clip_options(parser: argparse.ArgumentParser) -> None:
    """How videos are cut into clips, a row each (``mmbatch.sources.clips``)."""
    from mmbatch.media.scenes import DEFAULT_MIN_SCENE_SECONDS, DEFAULT_SCENE_THRESHOLD

    group = parser.add_argument_group(
        "video clips",
        "cut each video into clips, a row each (rows carry start and end, in seconds); each "
        "clip goes to the model as a video, its frames sampled by --num-frames, --fps or "
        "--keyframes, or as one picture (--clip-frame)",
    )
    group.add_argument(
        "--clip-seconds", type=float, default=None, metavar="N", help="clips of N seconds"
    )
    group.add_argument(
        "--stride",
        type=float,
        default=None,
        metavar="S",
        help="a clip starts every S seconds (default: N, back to back)",
    )
    group.add_argument(
        "--scenes",
        action="store_true",
        help="a clip per scene, cut where FFmpeg's scene score is above --scene-threshold "
        "(with --clip-seconds, longer scenes are cut further)",
    )
    group.add_argument(
        "--scene-threshold",
        type=float,
        default=DEFAULT_SCENE_THRESHOLD,
        metavar="T",
        help="FFmpeg's scene score, 0 to 1, above which a frame starts a scene "
        "(default %(default)s: select='gt(scene,%(default)s)')",
    )
    group.add_argument(
        "--min-scene-seconds",
        type=float,
        default=DEFAULT_MIN_SCENE_SECONDS,
        metavar="SECONDS",
        help="ignore a scene change this soon after the last (default %(default)s)",
    )
    group.add_argument(
        "--clip-frame",
        choices=("middle", "keyframe"),
        default=None,
        help="give each clip to the model as one picture: its middle frame, or its key "
        "frame nearest the middle",
    )


def clip_split_from(args: argparse.Namespace) -> ClipSplit | None:
    """The clip flags as a ``ClipSplit``, None when no video is to be cut; flags that cannot
    go together are a ``ConfigError`` naming them."""
    from mmbatch.errors import ConfigError
    from mmbatch.sources.clips import ClipSplit

    if args.clip_seconds is None and not args.scenes:
        given = {"--stride": args.stride is not None, "--clip-frame": bool(args.clip_frame)}
        cutting_only = [flag for flag, used in given.items() if used]
        if cutting_only:
            raise ConfigError(
                f"{', '.join(cutting_only)} applies to clips: add --clip-seconds N or --scenes"
            )
        return None
    if args.timestamps:
        raise ConfigError(
            "--timestamps picks frames of a whole video; sample clips with --num-frames, "
            "--fps or --keyframes"
        )
    if args.clip_frame:
        sampled = [f for f in ("fps", "num_frames", "keyframes") if getattr(args, f)]
        if sampled:
            flag = "--" + sampled[0].replace("_", "-")
            raise ConfigError(f"{flag} samples a clip's frames; --clip-frame takes one frame")
    return ClipSplit(
        args.clip_seconds,
        args.stride,
        args.scenes,
        args.scene_threshold,
        args.min_scene_seconds,
        args.clip_frame,
    )


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


def source_policy_from(args: argparse.Namespace) -> SourcePolicy:
    from mmbatch.sources.files import SourcePolicy

    keep = keep_columns_from(args, "none")
    return SourcePolicy(local_paths_from(args), args.allow_urls, keep)


def keep_columns_from(args: argparse.Namespace, default: str) -> KeepColumns:
    """``--keep-columns`` (``default`` when not given) as the sources take it."""
    from mmbatch.errors import ConfigError

    value = getattr(args, "keep_columns", None) or default
    if value == "all":
        return "all"
    if value == "none":
        return ()
    names = tuple(name.strip() for name in value.split(","))
    if not all(names):
        raise ConfigError(f"--keep-columns {value!r}: name columns as a,b,c (or all, none)")
    return names


def url_policy_from(args: argparse.Namespace) -> UrlPolicy | None:
    from mmbatch.media.fetch import UrlPolicy

    return UrlPolicy(args.url_max_bytes, args.url_timeout) if args.allow_urls else None


def sampling_from(args: argparse.Namespace, base: Sampling | None = None) -> Sampling:
    """``base`` (default: mmbatch's, greedy) with each sampling flag given laid over it;
    a value out of range is a ``ConfigError`` naming the flag and what it allows."""
    from dataclasses import replace

    from mmbatch.errors import ConfigError
    from mmbatch.types import InvalidSetting, Sampling

    given = {f: getattr(args, f) for f in SAMPLING_FLAGS if getattr(args, f, None) is not None}
    if getattr(args, "stop", None):
        given["stop"] = tuple(args.stop)
    try:
        return replace(base or Sampling(), **given)
    except InvalidSetting as exc:
        flag = SAMPLING_FLAGS.get(exc.field, ("--" + exc.field.replace("_", "-"),))[0]
        raise ConfigError(f"{flag} {exc.value!r}: must be {exc.rule}") from None


def run_config_from(args: argparse.Namespace) -> RunConfig:
    from mmbatch.pipeline import RunConfig

    return RunConfig(
        progress=not (args.no_progress or getattr(args, "quiet", False)),
        decode_workers=args.decode_workers,
        memory_budget=args.memory_budget,
    )


_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _size(text: str) -> int:
    """``4G``, ``512M``, ``1.5G`` or plain bytes, for ``--memory-budget``."""
    number, unit = text.strip().upper().rstrip("IB"), ""
    if number and number[-1] in _UNITS:
        number, unit = number[:-1], number[-1]
    try:
        return int(float(number) * _UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4G, 512M)") from None


def engine_args_from(args: argparse.Namespace) -> dict[str, Any]:
    """The --engine-arg pairs, with --trust-remote-code when it was given."""
    from mmbatch.engine.config import parse_engine_args

    engine_args = parse_engine_args(args.engine_arg)
    if args.trust_remote_code:
        engine_args["trust_remote_code"] = True
    return engine_args


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    from mmbatch.engine.config import EngineConfig

    return EngineConfig(
        args.model,
        engine_args_from(args),
        engine_log_from(args),
        "-v",
        gpus=args.gpus,
        log_shown=engine_log_shown_from(args),
        engines_per_gpu=args.engines_per_gpu,
        batch_invariant=args.batch_invariant,
    )


def video_options_from(args: argparse.Namespace) -> VideoOptions:
    from mmbatch.errors import ConfigError
    from mmbatch.media.options import VideoOptions

    common: dict[str, Any] = {
        "max_frames": args.max_frames,
        "max_pixels": args.max_pixels,
        "max_source_pixels": args.max_source_pixels,
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


def audio_options_from(args: argparse.Namespace) -> AudioOptions:
    """The audio flags; without --sample-rate, the model's own rate is used."""
    from mmbatch.media.options import AudioOptions

    return AudioOptions(args.sample_rate, args.audio_window, args.audio_overlap)


def file_output_from(args: argparse.Namespace) -> FileOutput:
    from mmbatch.output.file_output import FileOutput

    return FileOutput.at(
        args.out,
        getattr(args, "out_format", None),
        getattr(args, "shard_rows", None),
        retry_errors=args.retry_errors,
        force=args.force,
        overwrite=args.overwrite,
    )
