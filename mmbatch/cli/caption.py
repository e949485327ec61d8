"""``mmbatch caption``: one JSON row per image, video clip or audio window.

The modality of each file is picked by its suffix. Videos are captioned whole with
``--as-clip`` (the sampled frames go to the model as one video), or cut into clips, a row
each (``--clip-seconds``, ``--stride``, ``--scenes``; rows carry ``start`` and ``end``);
audio files are cut into windows (rows carry ``start`` and ``end``). A local dataset's rows
are images."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from mmbatch.cli import ray
from mmbatch.cli.launch import engine_begun, launch
from mmbatch.cli.options import (
    Commands,
    add_audio_options,
    add_clip_options,
    add_input_options,
    add_model_options,
    add_prompt_options,
    add_video_options,
    audio_options_from,
    clip_split_from,
    engine_config_from,
    file_output_from,
    keep_columns_from,
    local_paths_from,
    sampling_from,
    source_policy_from,
    unused_flag_warnings,
    url_policy_from,
    video_options_from,
)
from mmbatch.sources import DEFAULT_PROMPT, DEFAULT_PROMPTS
from mmbatch.words import counted

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.early import EngineStart
    from mmbatch.media.options import MediaOptions
    from mmbatch.sources.clips import ClipSplit
    from mmbatch.sources.local_datasets import DatasetFormat, DatasetInput
    from mmbatch.sources.log import ListingLog
    from mmbatch.types import Modality, Request, Sampling


InputFormat: TypeAlias = "DatasetFormat | Literal['files']"
"""How INPUT is read: files by path, or one local dataset of a format."""


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "caption",
        help="caption images: one JSON row per input item",
        description="Caption every image in INPUT (files, folders, globs, .jsonl/.csv "
        "manifests with a 'path' and optional 'id' and 'prompt'), or every row of one local "
        "Hugging Face dataset (a save_to_disk folder, Parquet files, an imagefolder with a "
        "metadata file, WebDataset tars).",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT")
    dataset = parser.add_argument_group("local datasets")
    dataset.add_argument(
        "--input-format",
        choices=("files", "disk", "parquet", "imagefolder", "webdataset"),
        default=None,
        help="how to read INPUT (default: detected; 'files' = images by path)",
    )
    dataset.add_argument(
        "--image-column", default=None, help="the dataset's image column (default: the only one)"
    )
    dataset.add_argument("--split", default=None, help="the dataset split (default: the only one)")
    dataset.add_argument("--id-column", default=None, help="row ids (default: the row index)")
    add_prompt_options(parser, None, "item")
    parser.add_argument(
        "--as-clip", action="store_true", help="caption each video whole, as one clip"
    )
    add_video_options(parser, sampling_required=False)
    add_clip_options(parser)
    add_audio_options(parser)
    add_model_options(parser)
    ray.add_options(parser)
    add_input_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, engine: Engine | None = None) -> int:
    """Caption ``args.inputs`` into ``args.out``; ``engine`` replaces the vLLM engine that
    ``--model`` and ``--engine-arg`` describe (the tests' fake engine comes in this way)."""
    from mmbatch.errors import ConfigError
    from mmbatch.media.options import ImageOptions, MediaOptions

    # Everything that can be checked without the engine is checked before it starts.
    config = engine_config_from(args)
    media = MediaOptions(
        image=ImageOptions(args.max_pixels, args.max_source_pixels),
        video=video_options_from(args),
        audio=audio_options_from(args),
        urls=url_policy_from(args),
    )
    clips = clip_split_from(args)
    if clips is not None and args.ray is not None:
        raise ConfigError("--clip-seconds and --scenes run on this machine, not on Ray")
    if args.ray is None and args.out is not None:
        file_output_from(args)  # a bad --out is said before the inputs are read
    sampling = sampling_from(args)
    fmt = _input_format(args, clips)  # the options that fit no such input are said first
    guessed, size = _engine_guess(args, clips, fmt) if engine is None else (None, None)
    # The engine starts while the inputs are listed (and the model's processor asked what
    # it takes): the user waits for the longer, not for both.
    with engine_begun(args, config, guessed, size) as begun:
        return _run(args, fmt, config, media, clips, sampling, engine or begun)


def _run(
    args: argparse.Namespace,
    fmt: InputFormat,
    config: EngineConfig,
    media: MediaOptions,
    clips: ClipSplit | None,
    sampling: Sampling,
    engine: Engine | EngineConfig | EngineStart,
) -> int:
    """``run`` once the engine's start is begun: the inputs listed, the job run."""
    from dataclasses import asdict

    from mmbatch.jobs import Job, fingerprint
    from mmbatch.sources.log import ListingLog

    log = ListingLog()
    requests, info = _inputs(args, fmt, config, media, clips, log)
    ray_rows = info.pop("ray_rows", None)  # how Ray reads a dataset's rows: not a record
    # Only a job that cuts clips records how: the outputs of earlier jobs resume as they were.
    cutting = {"clips": asdict(clips)} if clips is not None else {}
    job = Job(
        requests,
        sampling,
        media,
        fingerprint=fingerprint(
            "caption",
            args.model,
            sampling,
            # Given no --prompt, as recorded before each kind had its own: a job's own
            # prompts are checked row by row on resume.
            prompt=args.prompt or DEFAULT_PROMPT,
            system=args.system,
            image_options=asdict(media.image),
            video_options=asdict(media.video),
            audio_options=asdict(media.audio),
            as_clip=args.as_clip,
            keep_columns=args.keep_columns,
            **cutting,
        ),
        info=info | {"model": args.model, "prompt": args.prompt or DEFAULT_PROMPTS} | log.to_dict(),
        notes=log.lines(),
    )
    print(f"mmbatch: {counted(len(job.item_ids), 'item')}, model {args.model}", file=sys.stderr)
    kinds = {ref.modality for request in requests for ref in request.media}
    for line in unused_flag_warnings(args, kinds | ({"video"} if clips is not None else set())):
        print(line, file=sys.stderr)
    on_ray = None if args.ray is None else partial(ray.run, args, engine=config, dataset=ray_rows)
    return launch(job, engine, args, on_ray)


def _engine_guess(
    args: argparse.Namespace, clips: ClipSplit | None, fmt: InputFormat
) -> tuple[dict[Modality, int] | None, int | None]:
    """The media a prompt of the job carries, and how many requests it has (None: not
    known), as the named inputs' names tell (``glance_at``), before they are listed: what
    its engine begins its start for. A dataset's rows are pictures (how many, known once
    it is read); files are taken as ``Takes`` says (videos only as clips; a clip cut as a
    frame is a picture), as if the model took them (its processor, asked while the engine
    starts, says), but audio beside other media only where ``--sample-rate`` asks for it:
    a model that sees rarely hears. Audio is cut into windows and videos into clips: their
    requests are known only once listed."""
    from mmbatch.sources.glance import glance_at
    from mmbatch.sources.mixed_media import Takes

    if fmt != "files":
        return {"image": 1}, None
    glance = glance_at(args.inputs)
    if glance.absent:
        return None, None  # the listing refuses the job: no engine is needed
    takes = Takes(("image", "video", "audio"), as_clip=args.as_clip, clips=clips)
    clip: Modality = "image" if clips is not None and clips.frame else "video"
    taken = glance.kinds & takes.wanted()
    if taken - {"audio"} and args.sample_rate is None:
        taken -= {"audio"}  # beside pictures or clips, left to the processor: few models take both
    kinds = {clip if kind == "video" else kind for kind in taken}
    if not kinds:  # nothing seen (a manifest, a pattern): pictures, or the clips asked for
        kinds = {"video"} if takes.whole_videos and clip == "video" else {"image"}
    one_each = clips is None and "audio" not in glance.kinds
    return dict.fromkeys(sorted(kinds), 1), glance.files(taken) if one_each else None


def _inputs(
    args: argparse.Namespace,
    fmt: InputFormat,
    config: EngineConfig,
    media: MediaOptions,
    clips: ClipSplit | None,
    log: ListingLog,
) -> tuple[list[Request], dict[str, Any]]:
    """The requests of the inputs read as ``fmt`` (``_input_format``), and what the summary
    records about them (the gallery reopens a dataset from it); what listing passed over
    goes to ``log``."""
    from dataclasses import asdict

    from mmbatch.sources.local_datasets import DatasetInput, dataset_requests

    if fmt == "files":
        return _file_requests(args, config, media, clips, log), {"inputs": list(args.inputs)}
    spec = DatasetInput(args.inputs[0], fmt, args.image_column, args.split, args.id_column)
    if args.ray is not None:
        return _ray_dataset(spec, args)
    keep = keep_columns_from(args, "all")
    requests = dataset_requests(
        spec, args.prompt or DEFAULT_PROMPT, args.system, keep, local_paths_from(args)
    )
    return requests, {"inputs": list(args.inputs), "dataset": asdict(spec)}


def _input_format(args: argparse.Namespace, clips: ClipSplit | None) -> InputFormat:
    """How INPUT is read: ``files``, or the format of the one dataset it names (as given,
    else detected), the options checked against it: said before an engine begins."""
    from mmbatch.errors import ConfigError
    from mmbatch.sources.local_datasets import detect_format

    fmt: InputFormat | None = args.input_format
    if fmt is None:
        detected = [found for found in map(detect_format, args.inputs) if found is not None]
        if detected and len(args.inputs) > 1:
            raise ConfigError("a dataset is read one at a time; name it alone as INPUT")
        fmt = detected[0] if detected else "files"
    if fmt == "files":
        if args.image_column or args.split or args.id_column:
            raise ConfigError("--image-column, --split and --id-column apply to datasets only")
        return "files"
    if clips is not None:
        raise ConfigError(f"a {fmt} dataset holds pictures: --clip-seconds and --scenes cut videos")
    if len(args.inputs) != 1:
        raise ConfigError(f"a {fmt} dataset is read one at a time; got {len(args.inputs)} inputs")
    return fmt


def _ray_dataset(
    spec: DatasetInput, args: argparse.Namespace
) -> tuple[list[Request], dict[str, Any]]:
    """The requests of a dataset that Ray's tasks read (Parquet files, local or in storage):
    the driver learns the rows from the files' footers and ids; ``ray_rows`` in the info is
    how the Ray job reads them (``mmbatch.integrations.ray_data.parquet_rows``)."""
    from dataclasses import asdict

    from mmbatch.errors import ConfigError
    from mmbatch.sources.local_datasets import parquet_layout

    if spec.format != "parquet":
        raise ConfigError(
            f"on Ray a dataset is read from Parquet files (local or in storage), not a "
            f"{spec.format} dataset; run it without --ray"
        )
    if args.split is not None:
        raise ConfigError("on Ray a Parquet dataset is one split: drop --split")
    layout = parquet_layout(spec)
    requests = layout.requests(spec, args.prompt or DEFAULT_PROMPT, args.system)
    return requests, {"inputs": list(args.inputs), "dataset": asdict(spec), "ray_rows": layout}


def _file_requests(
    args: argparse.Namespace,
    config: EngineConfig,
    media: MediaOptions,
    clips: ClipSplit | None,
    log: ListingLog,
) -> list[Request]:
    """The requests of the files and folders named. Files are listed once; only if they
    hold more than pictures is the model asked which media it takes (its processor says),
    so that a folder walk collects those."""
    from mmbatch.sources.mixed_media import Takes, list_media, media_requests, modality_of
    from mmbatch.sources.timeline import clip_cap_note

    files = list_media(args.inputs, source_policy_from(args), log)
    pictures: frozenset[Modality] = frozenset({"image"})
    found = {modality_of(f.path) for f in files}
    # On Ray (pictures only) the model is not asked either: its workers load it.
    if found <= pictures or args.ray is not None:
        take = pictures
    elif args.dry_run:  # the processor's import is torch's: seconds a dry run does not spend
        take = frozenset(found)
        log.note(
            "videos and audio are planned as if the model takes them (the job asks its "
            "processor, which a dry run does not load)"
        )
    else:
        from mmbatch.engine.config import check_model_name
        from mmbatch.engine.processor import model_modalities

        check_model_name(config.model)  # said as such, not as a processor that fails
        take = model_modalities(config)
    takes = Takes(take, as_clip=args.as_clip, clips=clips)
    requests = media_requests(files, args.prompt, args.system, takes=takes, media=media, log=log)
    clip_note = clip_cap_note(media.video)
    if clip_note and any(r.media and r.media[0].modality == "video" for r in requests):
        log.note(clip_note)
    return requests
