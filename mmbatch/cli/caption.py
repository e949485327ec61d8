"""``mmbatch caption``: one JSON row per image, video clip or audio window.

The modality of each file is picked by its suffix. Videos are captioned whole with
``--as-clip`` (the sampled frames go to the model as one video); audio files are cut into
windows (rows carry ``start`` and ``end``). A local dataset's rows are images."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from mmbatch.cli.common import (
    add_input_options,
    add_model_options,
    add_resume_options,
    engine_config_from,
    sampling_from,
    source_policy_from,
    url_policy_from,
)
from mmbatch.cli.jobs import Job, job_fingerprint, run_resumable
from mmbatch.cli.media import (
    add_audio_options,
    add_video_options,
    audio_options_from,
    model_modalities,
    video_options_from,
)
from mmbatch.cli.on_ray import add_ray_options, run_on_ray
from mmbatch.engine.base import Engine
from mmbatch.types import Modality

DEFAULT_PROMPT = "Describe this image in one sentence."


def register(commands: Any) -> None:
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
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for each item")
    parser.add_argument("--system", default=None, help="system prompt (default: the model's)")
    parser.add_argument(
        "--max-pixels", type=int, default=None, help="downscale images and frames to at most this"
    )
    parser.add_argument(
        "--as-clip", action="store_true", help="caption each video whole, as one clip"
    )
    add_video_options(parser, sampling_required=False)
    add_audio_options(parser)
    add_model_options(parser)
    add_ray_options(parser)
    add_resume_options(parser)
    add_input_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, make_engine: Callable[[], Engine] | None = None) -> int:
    """Caption ``args.inputs`` into ``args.out``. ``make_engine`` replaces the vLLM engine
    (the tests' fake engine goes through the same command this way)."""
    from mmbatch.config import ImageOptions
    from mmbatch.media.loader import MediaLoader
    from mmbatch.outputs import output_format

    # Everything that can be checked without the engine is checked before it starts.
    video, audio = video_options_from(args), audio_options_from(args)
    requests, unusable, summary = _inputs(args, audio)
    engine_config = engine_config_from(args)
    out_format = output_format(args.out, args.out_format)
    image_options = ImageOptions(max_pixels=args.max_pixels)
    loader = MediaLoader(
        image_options, urls=url_policy_from(args), video_options=video, audio_options=audio
    )
    sampling = sampling_from(args)
    print(f"mmbatch: {len(requests) + len(unusable)} items, model {args.model}", file=sys.stderr)
    if args.ray is not None:
        _pictures_only(requests)
        summary |= {"model": args.model, "prompt": args.prompt, "output_format": out_format}
        # The Ray path writes its own output folder; it is not resumable (yet).
        return run_on_ray(
            args,
            requests,
            summary,
            engine_config=engine_config,
            sampling=sampling,
            image_options=image_options,
            out_format=out_format,
            unusable=unusable,
        )

    def make_vllm_engine() -> Engine:
        from mmbatch.engine.shared import shared_engine
        from mmbatch.media_sources import modalities_in

        engine = shared_engine(engine_config, modalities_in(requests) or {"image": 1})
        # Prompts are measured against this engine before they are sent (and clips shrunk).
        loader.budget = engine.prompt_budget()
        if args.sample_rate is None and loader.budget.audio is not None:
            loader.audio_options = audio_options_from(args, loader.budget.audio.sample_rate)
        return engine

    job = Job(
        requests=requests,
        unusable=unusable,
        loader=loader,
        make_engine=make_engine or make_vllm_engine,
        sampling=sampling,
        fingerprint=job_fingerprint(
            "caption",
            args.model,
            sampling,
            prompt=args.prompt,
            system=args.system,
            image_options=asdict(image_options),
            video_options=asdict(video),
            audio_options=asdict(audio),
            as_clip=args.as_clip,
        ),
        summary=summary | {"model": args.model, "prompt": args.prompt, "output_format": out_format},
    )
    return run_resumable(args, job, out_format)


def _pictures_only(requests: Any) -> None:
    from mmbatch.errors import ConfigError
    from mmbatch.types import Unreadable

    refs = [ref for r in requests for ref in r.media if not isinstance(ref.part, Unreadable)]
    if any(ref.modality != "image" or ref.part is not None for ref in refs):
        raise ConfigError("--ray runs image jobs only; caption video and audio without --ray")


def _inputs(args: argparse.Namespace, audio: Any) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The requests, the dataset rows that cannot become one (as error rows), and what the
    summary records about the inputs (the gallery reopens a dataset from it)."""
    from mmbatch.errors import ConfigError
    from mmbatch.integrations.hf_local import DatasetInput, dataset_requests, detect_format
    from mmbatch.media_sources import caption_requests, modality_of
    from mmbatch.sources import AUDIO_SUFFIXES, IMAGE_SUFFIXES, VIDEO_SUFFIXES, expand_inputs

    fmt = args.input_format
    if fmt is None:
        detected = [found for found in map(detect_format, args.inputs) if found is not None]
        if detected and len(args.inputs) > 1:
            raise ConfigError("a dataset is read one at a time; name it alone as INPUT")
        fmt = detected[0] if detected else None
    if fmt in (None, "files"):
        if args.image_column or args.split or args.id_column:
            raise ConfigError("--image-column, --split and --id-column apply to datasets only")
        policy = source_policy_from(args)
        # First that the inputs exist; then, only if they hold more than pictures, which
        # media the model takes (its processor says), so that a folder is walked for those.
        everything = IMAGE_SUFFIXES | AUDIO_SUFFIXES | VIDEO_SUFFIXES
        found = {modality_of(path) for _, path, _ in expand_inputs(args.inputs, everything, policy)}
        pictures: frozenset[Modality] = frozenset({"image"})
        # On Ray (pictures only) the model is not asked either: its workers load it.
        only_pictures = found <= pictures or args.ray is not None
        take = pictures if only_pictures else model_modalities(engine_config_from(args))
        requests = caption_requests(
            args.inputs,
            args.prompt,
            args.system,
            take=take,
            as_clip=args.as_clip,
            audio=audio,
            policy=policy,
        )
        return requests, [], {"inputs": list(args.inputs)}
    if len(args.inputs) != 1:
        raise ConfigError(f"a {fmt} dataset is read one at a time; got {len(args.inputs)} inputs")
    spec = DatasetInput(args.inputs[0], fmt, args.image_column, args.split, args.id_column)
    requests, unusable = dataset_requests(spec, args.prompt, args.system)
    return requests, unusable, {"inputs": list(args.inputs), "dataset": asdict(spec)}
