"""Running a job from a command: its engine begun while the inputs are read, then the job cut
to ``--limit``, described (``--dry-run``) or run into ``--out`` (on a kept engine with
``--engine``, or on Ray), and its summary printed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from mmbatch.cli.options import EXIT_OK, file_output_from, run_config_from
from mmbatch.cli.terminal import show_summary

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.early import EngineStart
    from mmbatch.jobs import Job
    from mmbatch.types import Modality


def launch(
    job: Job,
    engine: Engine | EngineConfig | EngineStart,
    args: argparse.Namespace,
    on_ray: Callable[[Job], int] | None = None,
) -> int:
    """What every job command does with the job its inputs became: cut it to ``--limit``
    items, then describe it (``--dry-run``), or run it into ``--out`` (on Ray: ``on_ray``)."""
    if args.limit is not None:
        listed = len(job.item_ids)
        job = job.first(args.limit)
        print(
            f"mmbatch: --limit {args.limit}: the first {len(job.item_ids)} of {listed} items",
            file=sys.stderr,
        )
    if args.dry_run:
        from mmbatch.cli.describe import describe_job
        from mmbatch.engine.early import EngineStart

        # A dry run begins no engine (``engine_begun``): ``engine`` is what it would start.
        assert not isinstance(engine, EngineStart)
        print("\n".join(describe_job(job, engine, on_ray is not None, args.out)))
        return EXIT_OK
    if on_ray is not None:
        return on_ray(job)
    return run_to_file(job, engine, args)


@contextmanager
def engine_begun(
    args: argparse.Namespace,
    config: EngineConfig,
    media: dict[Modality, int] | None,
    requests: int | None = None,
) -> Iterator[EngineConfig | EngineStart]:
    """The engine for ``config`` begun now, while the face reads its inputs inside the
    ``with`` (``mmbatch.engine.early``), for a job of about ``requests`` carrying ``media``
    per prompt as the face guessed them cheaply (``--limit`` caps the size); closed if
    reading them fails. ``config`` itself (started once the inputs are read) where ``media``
    or ``requests`` is None (not guessed), or
    where ``--out`` already holds rows (or is in storage): only what is left to run says
    whether an engine is needed, and for how much; and for a dry run (no engine), a job on
    a kept engine (``--engine``) or on Ray (its engines are its workers')."""
    from mmbatch.engine.early import begun_while_reading

    if requests is not None and getattr(args, "limit", None) is not None:
        requests = min(requests, args.limit)  # a trial's size, whatever the folder holds
    elsewhere = getattr(args, "engine", None) is not None or getattr(args, "ray", None) is not None
    if media is None or args.dry_run or elsewhere or _resumes(args, config):
        media = None
    with begun_while_reading(config, media, requests) as begun:
        yield begun


def _resumes(args: argparse.Namespace, config: EngineConfig) -> bool:
    """``--out`` is in storage, or already holds rows (or a run's progress). A new local
    output is checked writable first (with vLLM's log beside it), as the job checks it: a
    folder it cannot write in is said before an engine begins."""
    from pathlib import Path

    from mmbatch.output.writable import check_writable

    out = file_output_from(args)
    if out.url is not None or out.paths.rows.exists() or out.paths.progress.exists():
        return True
    log = Path(config.log_file) if config.log_file is not None else None
    check_writable(out.paths.rows, [out.paths.progress, log])
    return False


def run_to_file(
    job: Job, engine: Engine | EngineConfig | EngineStart, args: argparse.Namespace
) -> int:
    """Run ``job`` into ``--out`` (resuming there), print the summary, return the exit code:
    0 when every row of the output is ok, 1 when any is an error."""
    from mmbatch.jobs import run_job

    job, engine = kept_engine_for(job, engine, args)
    report = run_job(job, engine, file_output_from(args), run_config_from(args))
    return show_summary(report, args)


def kept_engine_for(
    job: Job, engine: Engine | EngineConfig | EngineStart, args: argparse.Namespace
) -> tuple[Job, Engine | EngineConfig | EngineStart]:
    """The kept engine ``--engine`` names, for a job that would start ``engine`` (a config),
    and the job saying so in its summary; refused in one line if the job needs another
    engine. Without ``--engine``: the job and ``engine`` as they are."""
    from dataclasses import replace

    from mmbatch.engine.config import EngineConfig
    from mmbatch.errors import ConfigError

    name = getattr(args, "engine", None)
    if name is None:
        return job, engine
    if not isinstance(engine, EngineConfig):
        raise ConfigError("--engine runs a model's job: give the job --model too")
    from mmbatch.engine.kept import connect_engine
    from mmbatch.jobs import media_per_prompt

    kept = connect_engine(name, engine, media_per_prompt(job.requests))
    print(f"mmbatch: on the kept engine {name} ({kept.layout})", file=sys.stderr)
    return replace(job, info={**job.info, "engines": f"kept engine {name}: {kept.layout}"}), kept
