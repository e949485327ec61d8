"""``--ray``: run a job command's requests on a Ray cluster instead of in this process.

The options are declared here so that every job command offers the same ones; ray itself
is imported only when ``--ray`` is given, and its absence is a one-line error with the
install hint.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from mmbatch.cli.common import EXIT_ITEMS_FAILED, EXIT_OK, run_config_from


def add_ray_options(parser: argparse.ArgumentParser) -> None:
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
        help="GPUs per engine (default: tensor_parallel_size; 0 on vLLM's CPU build)",
    )
    group.add_argument(
        "--ray-batch",
        type=int,
        default=None,
        metavar="N",
        help="distinct pictures per actor batch (every request of each goes with it)",
    )


def run_on_ray(
    args: argparse.Namespace,
    items: Sequence[Any],
    job_info: dict[str, Any],
    *,
    engine_config: Any,
    sampling: Any,
    image_options: Any,
    out_format: str = "jsonl",
    recipe: Any = None,
    unusable: Sequence[Any] = (),
) -> int:
    """Run ``items`` (one request each: a caption, or a recipe's item) on Ray into the
    folder ``args.out``; resume there if it has rows."""
    from mmbatch.errors import ConfigError
    from mmbatch.integrations import ray_data
    from mmbatch.integrations.row_files import ROW_FORMATS
    from mmbatch.outputs import write_summary

    try:
        ray_data.import_ray()
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    in_memory = any(ref.data is not None or ref.image is not None for r in items for ref in r.media)
    if unusable or in_memory:
        raise ConfigError(
            "on Ray the inputs are image files that every node can read; run local datasets "
            "(--input-format) without --ray"
        )
    if out_format not in ROW_FORMATS:
        raise ConfigError(f"on Ray, --out-format is one of {ROW_FORMATS}")
    job = ray_data.RayJob(
        engine_config,
        sampling,
        image_options,
        prompt=recipe.questions[0].text if recipe is not None else None,
        window=run_config_from(args).window,
        recipe=recipe,
    )
    batch = {"batch_groups": args.ray_batch} if args.ray_batch else {}
    resources = ray_data.RayResources(
        replicas=args.replicas,
        gpus_per_replica=args.gpus_per_replica,
        env=ray_data.forwarded_env(),
        **batch,
    )
    ray_data.connect(args.ray)
    dataset = ray_data.requests_dataset(items)
    report = ray_data.run_on_ray(dataset, job, resources, args.out, out_format)
    print(report.summary(), file=sys.stderr)
    job_info |= {"ray": {"address": args.ray, "replicas": args.replicas}}
    summary = write_summary(args.out, report.to_dict(), job_info)
    print(f"rows written to the folder {args.out}, summary to {summary}", file=sys.stderr)
    return EXIT_OK if report.failed == 0 else EXIT_ITEMS_FAILED
