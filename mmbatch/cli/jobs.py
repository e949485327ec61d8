"""The steps every job command shares around the pipeline: resume, run, quarantine, report.

A command lists its requests and builds its loader; this module turns that into a job
that can be stopped at any moment and rerun to continue (``mmbatch.resume``), starts the
engine only when something is left to do, and derives the exit code and the summary from
the whole output, not from this run alone: a resumed job whose earlier rows hold errors
still exits 1.

JSONL outputs are resumed in place. Columnar outputs (Parquet, a datasets folder) are
written through a JSONL spool beside them that becomes the file on close; a stopped job
resumes from its spool, and a finished one from its own rows (copied back to a spool).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.cli.common import EXIT_ITEMS_FAILED, EXIT_OK, run_config_from
from mmbatch.engine.base import Engine
from mmbatch.errors import FatalEngineError
from mmbatch.types import Request, Result, Sampling

if TYPE_CHECKING:
    from mmbatch.outputs import OutputFormat
    from mmbatch.resume import OutputTally
    from mmbatch.rows import RowBuilder
    from mmbatch.stats import JobStats


@dataclass(frozen=True)
class Job:
    """One command's work, as ``run_resumable`` needs it."""

    requests: Sequence[Request]
    loader: Any
    make_engine: Callable[[], Engine]
    """Called only when some request still needs the engine."""
    sampling: Sampling
    fingerprint: Mapping[str, Any]
    """What makes two runs the same job (see ``job_fingerprint``)."""
    rows: RowBuilder | None = None
    """How finished requests become rows (default: one flat row per request)."""
    unusable: Sequence[tuple[Request, Result]] = ()
    """Items that failed before the pipeline (a dataset row with no image): error rows."""
    summary: Mapping[str, Any] = field(default_factory=dict)
    """What the summary file records about the job (inputs, model, prompt...)."""


def job_fingerprint(command: str, model: str, sampling: Sampling, **task: Any) -> dict[str, Any]:
    """What makes two runs the same job: the command, model, sampling and the ``task``
    settings (prompt, decode options). Engine arguments are left out: they change speed
    and memory, and a user resuming on another machine must be able to change them."""
    return {"command": command, "model": model, "sampling": asdict(sampling), **task}


def run_resumable(args: argparse.Namespace, job: Job, out_format: OutputFormat) -> int:
    """Run the items of ``job`` that have no row in ``args.out`` yet; return the exit code."""
    from mmbatch.outputs import open_sink, write_summary
    from mmbatch.pipeline import run_job
    from mmbatch.resume import job_record_path, prepare
    from mmbatch.sinks import output_row
    from mmbatch.stats import JobStats

    out = Path(args.out)
    run_config = run_config_from(args)  # checked before anything is written
    progress = _progress_file(out, out_format)
    everything = [*job.requests, *(request for request, _ in job.unusable)]
    plan = prepare(
        progress,
        everything,
        job.fingerprint,
        record=job_record_path(out),
        force=args.force,
        retry_errors=args.retry_errors,
    )
    note = plan.describe(out)
    if note:
        print(f"mmbatch: {note}", file=sys.stderr)
    pending = {request.row_id for request in plan.pending}
    requests = [r for r in job.requests if r.row_id in pending]
    unusable = [(r, failure) for r, failure in job.unusable if r.row_id in pending]

    stats: JobStats | None = None
    if requests or unusable or progress != out:
        sink = open_sink(out, out_format, append=True)
        try:
            for request, failure in unusable:
                sink.write(output_row(request, (), failure))
            if requests:
                engine = job.make_engine()
                stats = run_job(
                    requests, engine, job.loader, sink, job.sampling, run_config, job.rows
                )
        except FatalEngineError as exc:
            sink.close()
            tally = _tally(out, out_format, everything)
            left = len(everything) - tally.ok - tally.failed
            raise FatalEngineError(
                f"{exc}\nThe {tally.ok + tally.failed} rows finished are saved in {out} "
                f"({left} items left); run the same command again to resume."
            ) from exc
        sink.close()
    stats = stats or JobStats()
    stats.total += len(unusable)
    for _, failure in unusable:
        stats.record(failure)
    if stats.total:
        print(stats.summary(), file=sys.stderr)
    tally = _tally(out, out_format, everything)
    whole = stats.to_dict() | {
        "total": len(everything),
        "ok": tally.ok,
        "failed": tally.failed,
        "failed_by_stage": dict(tally.failed_by_stage),
        "failed_by_kind": dict(tally.failed_by_kind),
        "rows_from_earlier_runs": plan.kept_ok + plan.kept_failed,
    }
    summary = write_summary(out, whole, job.summary)
    print(
        f"rows written to {out}: {tally.ok} ok, {tally.failed} failed; summary in {summary}",
        file=sys.stderr,
    )
    if tally.quarantine is not None:
        from mmbatch.stats import format_counts

        print(
            f"failed inputs ({format_counts(tally.failed_by_kind)}) listed in {tally.quarantine}",
            file=sys.stderr,
        )
    return EXIT_OK if tally.failed == 0 else EXIT_ITEMS_FAILED


def _progress_file(out: Path, out_format: OutputFormat) -> Path:
    """The JSONL file that resume reads: the output itself, or a columnar output's spool
    (recreated from the output's rows when a finished job is run again)."""
    if out_format == "jsonl":
        return out
    from mmbatch.outputs import read_rows
    from mmbatch.resume import write_rows
    from mmbatch.table_sinks import SPOOL_SUFFIX

    spool = out.with_name(out.name + SPOOL_SUFFIX)
    if not spool.exists() and out.exists():
        write_rows(spool, read_rows(out))
    return spool


def _tally(out: Path, out_format: OutputFormat, requests: Sequence[Request]) -> OutputTally:
    from mmbatch import outputs, resume

    rows = resume.read_rows(out) if out_format == "jsonl" else outputs.read_rows(out)
    return resume.finish(rows, requests, resume.quarantine_path(out))
