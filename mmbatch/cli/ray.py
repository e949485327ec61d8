"""``--ray``: run a job command's items on a Ray cluster instead of in this process.

The options are declared here so that every job command offers the same ones; ray itself
is imported only when ``--ray`` is given, and its absence is a one-line error with the
install hint.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mmbatch.cli.terminal import show_summary

if TYPE_CHECKING:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.integrations.ray_data import RayResources
    from mmbatch.integrations.ray_replica import RayJob
    from mmbatch.jobs import Job
    from mmbatch.output.file_output import FileOutput
    from mmbatch.recipe.spec import Recipe
    from mmbatch.sources.local_datasets import ParquetLayout
    from mmbatch.types import Request


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Ray", "run on a Ray cluster (needs mmbatch[ray]); --out is then a folder"
    )
    group.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray: the cluster at ADDRESS (e.g. auto, ray://head:10001), or without "
        "ADDRESS Ray's default (a running local cluster, else a new one); put it after INPUT",
    )
    group.add_argument("--replicas", type=int, default=1, help="engines, one per Ray actor")
    group.add_argument(
        "--gpus-per-replica",
        type=float,
        default=None,
        help="GPUs per engine (default: tensor_parallel_size x pipeline_parallel_size, or 0 "
        "where vLLM's CPU build is installed)",
    )
    group.add_argument(
        "--ray-batch",
        type=int,
        default=None,
        metavar="N",
        help="distinct pictures per actor batch (every request of each goes with it)",
    )


def run(
    args: argparse.Namespace,
    job: Job,
    engine: EngineConfig,
    recipe: Recipe | None = None,
    dataset: ParquetLayout | None = None,
) -> int:
    """Run ``job`` on Ray into the folder ``args.out`` (resuming there), one input row per
    item: a picture to caption, or a recipe's item, whose questions its replica asks; or a
    row of the Parquet ``dataset``, which Ray's tasks read."""
    from mmbatch.errors import ConfigError

    if getattr(args, "engine", None) is not None:
        raise ConfigError("--engine runs a job on this machine's kept engine, not on Ray")
    from mmbatch.integrations import ray_data

    try:
        ray_data.import_ray()
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    ray_job, resources, out, items = _planned(args, job, engine, recipe, dataset)
    # The driver checks the engine settings before any actor starts (``run_on_ray``); here
    # too, before Ray is used: a mistake is then one line. The check (vLLM's import, the
    # model's config) runs while Ray starts: each took seconds, one after the other.
    check = ray_data.SettingsCheck(engine)
    try:
        with ray_data.connected(args.ray, engine.log_file):
            check.wait()
            rows = _input_rows(items, dataset)
            known = items if dataset is not None else ray_data.driver_requests(items, ray_job)
            report = ray_data.run_on_ray(rows, ray_job, resources, out, known)
    except BaseException:
        # Whatever stopped the job is said once the check is done (its thread may hold the
        # terminal's output); a mistake in the settings first, as when it ran before Ray.
        check.wait()
        raise
    return show_summary(report, args, [f"note: {note}" for note in job.notes])


def _planned(
    args: argparse.Namespace,
    job: Job,
    engine: EngineConfig,
    recipe: Recipe | None,
    dataset: ParquetLayout | None,
) -> tuple[RayJob, RayResources, FileOutput, list[Request]]:
    """The job as Ray runs it, its output folder and its items (one row each), or a
    ``ConfigError`` for what the command line asks that Ray cannot do."""
    from mmbatch.errors import ConfigError
    from mmbatch.output.file_output import FileOutput

    if dataset is not None and args.limit is not None:
        raise ConfigError("on Ray a Parquet dataset is read whole: drop --limit")
    out_format = _out_format(args)
    items = _one_row_per_item(job.requests)
    if dataset is None:
        _check_items(items)
    ray_job, resources = _ray_job(args, job, engine, recipe)
    out = FileOutput.at(
        args.out,
        out_format,
        retry_errors=args.retry_errors,
        force=args.force,
        overwrite=args.overwrite,
    )
    return ray_job, resources, out, items


def _ray_job(
    args: argparse.Namespace, job: Job, engine: EngineConfig, recipe: Recipe | None
) -> tuple[RayJob, RayResources]:
    """What every replica needs of ``job`` (its settings), and how the job is spread over
    the cluster, as the command line says."""
    from mmbatch.engine.invariance import recorded
    from mmbatch.integrations import ray_data, ray_replica

    # Each replica's engine writes its log to the same path on its node (on one node, the
    # command's own file): a path that names it wherever the replica's worker runs from.
    log = None if engine.log_file is None else os.path.abspath(engine.log_file)
    engine = replace(engine, log_file=log)
    ray_job = ray_replica.RayJob(
        engine,
        job.sampling,
        job.media,
        prompt=recipe.questions[0].text if recipe is not None else None,
        recipe=recipe,
        fingerprint={**job.fingerprint, **recorded(engine)},
        info={
            **job.info,
            **recorded(engine),
            "ray": {"address": args.ray, "replicas": args.replicas, "vllm_log": log},
        },
    )
    batch = {"batch_groups": args.ray_batch} if args.ray_batch else {}
    resources = ray_data.RayResources(
        replicas=args.replicas,
        gpus_per_replica=args.gpus_per_replica,
        env=ray_data.forwarded_env(),
        **batch,
    )
    return ray_job, resources


def _out_format(args: argparse.Namespace) -> str:
    """The format of the output folder's files; ``ConfigError`` for output options Ray's
    writers do not take."""
    from mmbatch.errors import ConfigError
    from mmbatch.output.folders import FOLDER_FORMATS

    if getattr(args, "keep_columns", None) not in (None, "none"):
        raise ConfigError("--keep-columns is not supported with --ray yet")
    if getattr(args, "shard_rows", None) is not None:
        raise ConfigError("on Ray the output folder's files are Ray's blocks: drop --shard-rows")
    out_format: str = getattr(args, "out_format", None) or "jsonl"
    if out_format not in FOLDER_FORMATS:
        raise ConfigError(f"on Ray, --out-format is one of {FOLDER_FORMATS}")
    return out_format


def _input_rows(items: list[Request], dataset: ParquetLayout | None) -> Any:
    """The Ray Dataset of input rows: built from ``items`` on the driver (their paths or
    URLs), or read from the Parquet ``dataset`` by Ray's tasks."""
    from mmbatch.integrations import ray_data

    if dataset is None:
        return ray_data.requests_dataset(items)
    first = items[0]
    image, ids = dataset.image_column, dataset.id_column
    return ray_data.parquet_rows(dataset.files, image, ids, first.prompt, first.system)


def _one_row_per_item(requests: Sequence[Request]) -> list[Request]:
    """The first request of each item, named by the item: a recipe's replica asks the
    item's other questions itself."""
    first: dict[str, Request] = {}
    for request in requests:
        first.setdefault(request.row_id, request)
    return [replace(r, id=r.row_id, item_id=None, output=None) for r in first.values()]


def _check_items(items: list[Request]) -> None:
    from mmbatch.errors import ConfigError

    for item in items:
        if item.error is not None:
            raise ConfigError(
                f"{item.id!r}: {item.error.message} (on Ray, every input must be "
                "an image file that every node can read)"
            )
        if len(item.media) != 1:
            raise ConfigError(f"{item.id!r} has {len(item.media)} pictures; on Ray an item has one")
        ref = item.media[0]
        if ref.data is not None or ref.image is not None or ref.modality != "image" or ref.part:
            raise ConfigError(
                "--ray runs image files and Parquet datasets; run video and audio without --ray"
            )
