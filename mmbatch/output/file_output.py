"""A job's output on disk, as one object: where its rows go, and what a run asks of it.

A run (``mmbatch.jobs.run_job``, or Ray's driver, ``mmbatch.integrations.ray_data``) asks
the same things of its output, in this order, and each is a method here, so that the two
cannot drift apart:

1. ``ready``: the files can be written, a killed run's temporary files go, a columnar
   output's spool is restored, and the rows already there are checked and kept (resume);
2. ``record``: the job's fingerprint, once the job is sure to start;
3. ``open``: the sink this process writes rows to (Ray's writers write their own files);
4. ``count``: every row of the job's items, earlier runs' too, and the quarantine file;
   ``run_stats`` counts a run's own rows off the output, where another process wrote them;
5. ``summarise``: the counts, this run's figures and what was run, into the summary file,
   and the report a face prints.

The files are named in ``mmbatch.output.paths``. An output in object storage
(``FileOutput.at("s3://...")``) works on a local mirror of itself and commits to the store
as ``mmbatch.output.remote`` describes; each step above is the same, said of the store.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

from mmbatch.clock import milestones, process_seconds
from mmbatch.errors import ConfigError, MmbatchError, OutputError, SourceError
from mmbatch.jsonl import remove_orphans, write_atomic
from mmbatch.output.formats import check_shards, open_sink, output_format, read_output
from mmbatch.output.order import RowOrder
from mmbatch.output.paths import FileFormat, OutputPaths
from mmbatch.output.replacing import commit, draft_of, finish_replacing, prepare_draft
from mmbatch.output.resume import JobFacts, ResumePlan, prepare, write_record, written_rows
from mmbatch.output.rows import RowShape
from mmbatch.output.sinks import Sink
from mmbatch.output.stats import JobStats, OutputTally, count_output
from mmbatch.output.summary import JobReport, with_last_measured, write_summary
from mmbatch.output.target import LocalTarget, OutputTarget, target_at
from mmbatch.output.writable import check_writable
from mmbatch.storage.urls import unsupported_folder


class OutputJob(JobFacts, Protocol):
    """What an output needs to know of a job (``mmbatch.jobs.Job`` is one)."""

    @property
    def item_ids(self) -> set[str]:
        """The job's items, by ``Request.row_id``: one row each."""
        ...

    @property
    def notes(self) -> Sequence[str]:
        """What listing the inputs passed over or changed, repeated in the report."""
        ...


@dataclass(frozen=True)
class FileOutput:
    """Where a job's rows go, and how a rerun treats the rows already there."""

    path: Path
    format: FileFormat = "jsonl"
    retry_errors: bool = False
    """Redo the items whose row is an error (their old rows are removed first)."""
    force: bool = False
    """Append to an output written by a job with other settings."""
    shard_rows: int | None = None
    """Write a folder of shards of this many rows (Parquet, WebDataset); None: one file
    (WebDataset: ``mmbatch.output.shards.DEFAULT_SHARD_ROWS``)."""
    row_folder: bool = False
    """The rows are a folder of row files that Ray's writers add to (``jsonl`` or
    ``parquet``: ``mmbatch.integrations.ray_data``), not one output this process writes."""
    target: OutputTarget = field(default_factory=LocalTarget, compare=False)
    """Where the output is besides ``path`` (``mmbatch.output.target``): nowhere for a
    local output; for one in object storage, its URL and its state, ``path`` being its
    local mirror (``mmbatch.output.remote``)."""
    replaces: Path | None = None
    """The output this job replaces once it has finished (``--overwrite``); ``path`` is then
    the draft it writes meanwhile (``mmbatch.output.replacing``), which a rerun resumes."""

    def __post_init__(self) -> None:
        check_shards(self.format, self.shard_rows)

    @property
    def url(self) -> str | None:
        """The output's URL in object storage (None: a local output)."""
        return self.target.url

    @property
    def shown(self) -> str:
        """The output as messages name it: its URL, or its path."""
        if self.replaces is not None:
            return f"{self.path} (which replaces {self.replaces} once the job has finished)"
        return self.target.shown_as(self.path)

    @property
    def paths(self) -> OutputPaths:
        """The rows and every file the job writes beside them."""
        return OutputPaths(self.path, self.format, self.row_folder)

    @classmethod
    def at(
        cls,
        path: str | Path,
        format: str | None = None,
        shard_rows: int | None = None,
        *,
        retry_errors: bool = False,
        force: bool = False,
        overwrite: bool = False,
    ) -> FileOutput:
        """The output at ``path`` (a local path, or a URL in object storage), in ``format``
        or the one its name implies; a URL of any other protocol is a ``ConfigError``.
        ``overwrite``: a new job, which replaces the output at ``path`` only once it has
        finished (``mmbatch.output.replacing``)."""
        refusal = unsupported_folder(str(path))
        if refusal is not None:
            raise ConfigError(f"the output {refusal}")
        fmt = output_format(path, format)
        local, target = target_at(path)
        if not overwrite:
            return cls(local, fmt, retry_errors, force, shard_rows, target=target)
        if target.url is not None:
            raise ConfigError(
                "--overwrite replaces local outputs only; for an output in object storage, "
                "name another --out"
            )
        return cls(draft_of(local), fmt, retry_errors, force, shard_rows, replaces=local)

    def ready(self, job: JobFacts, log: Path | None = None) -> ResumePlan:
        """Make the output ready for ``job`` before anything starts (decode workers, engines,
        vLLM's import), and return what is left to do: the files the job writes can be made
        (``log``: vLLM's, appended to), a killed run's temporary files go, and the rows
        already there are checked and kept (``mmbatch.output.resume``), which is said. The
        job record is written apart (``record``), once the job is sure to start."""
        try:
            plan = self._ready(job, log)
        except MmbatchError as exc:
            raise self.target.translated(exc) from exc.__cause__
        note = plan.describe(self.shown)
        if note:
            print(f"mmbatch: {note}", file=sys.stderr)
        return plan

    def _ready(self, job: JobFacts, log: Path | None) -> ResumePlan:
        paths, target = self.paths, self.target
        target.fetch(paths, job.shape)
        check_writable(paths.rows, [paths.progress, log])
        if target.url is None:  # a local output: a replacement a kill cut short is finished
            finish_replacing(self._final)
        if self.replaces is not None:
            prepare_draft(paths, self._final, job.fingerprint)
        _remove_orphans(paths)
        _restore_spool(paths, job.shape)
        target.remember_ids(paths.progress, job.shape)
        plan = prepare(paths, job, force=self.force, retry_errors=self.retry_errors)
        target.commit_resume(paths, job.shape, bool(plan.pending))
        return plan

    def record(self, job: JobFacts) -> None:
        """Write whose rows these are (``job``'s fingerprint), for the next run's resume."""
        write_record(self.paths.record, job.fingerprint)
        self.target.upload_beside([self.paths.record])

    def open(self, job: JobFacts) -> Sink:
        """The sink for ``job``'s rows, appending to those already there; it leaves the rows
        in the job's order when it closes."""
        order = RowOrder([r.row_id for r in job.requests], job.shape.row_id)
        sink = open_sink(self.path, self.format, True, order, self.shard_rows)
        return self.target.wrap(sink, self.paths)

    def refresh(self) -> None:
        """Read a row folder in storage again, once Ray's writers have added to it (a local
        folder is read in place)."""
        if self.row_folder:
            self.target.refresh_folder(self.paths)

    def count(self, job: OutputJob, settled: bool = True) -> OutputTally:
        """Every row of ``job``'s items in the output, earlier runs' too, counted, and the
        quarantine file of the failed ones written. ``settled=False``: a row folder's
        writers may still be at work (``written_rows``)."""
        rows = written_rows(self.paths, job.shape, settled)
        return count_output(rows, job.shape, job.item_ids, self.paths.quarantine)

    def run_stats(self, job: OutputJob, ran: set[str], started: float) -> JobStats:
        """The stats of a run whose rows another process wrote (Ray's writers), counted off
        the output: the rows of the items ``ran``, since ``started``. The output must hold
        exactly one row for each of ``job``'s items."""
        rows = list(written_rows(self.paths, job.shape))
        by_id = _one_row_per_item(job.item_ids, rows, job.shape)
        stats = JobStats(total=len(ran), started=started)
        for item_id in sorted(ran):
            stats.record(job.shape.outcome(by_id[item_id]))
        stats.finished = time.perf_counter()
        return stats

    def summarise(
        self,
        job: OutputJob,
        plan: ResumePlan,
        run: JobStats,
        info: Mapping[str, Any],
        startup: float | None = None,
    ) -> JobReport:
        """Count every row of ``job``'s items (``count``), write the summary (with this
        ``run``'s stats, what ``info`` says of the job, and ``startup``: seconds from the
        process's start to its engine ready), and return the report a face prints."""
        try:
            report = self._summarise(job, plan, run, info, startup)
        except OutputError as exc:
            raise OutputError(
                f"{exc}; every row is in {self.shown}: free space and run the same command "
                "again to write the summary"
            ) from exc
        self.target.finish(report, self.paths)
        if self.replaces is not None:
            final = self._final
            commit(self.paths, final)
            report.out, report.summary_path = final.rows, final.summary
            if report.output.quarantine is not None:
                report.output.quarantine = final.quarantine
        return report

    @property
    def _final(self) -> OutputPaths:
        """The paths of the output this job leaves: the one it replaces, or its own."""
        if self.replaces is None:
            return self.paths
        return OutputPaths(self.replaces, self.format, self.row_folder)

    def _summarise(
        self,
        job: OutputJob,
        plan: ResumePlan,
        run: JobStats,
        info: Mapping[str, Any],
        startup: float | None,
    ) -> JobReport:
        tally = self.count(job)
        kept = plan.kept_ok + plan.kept_failed
        seconds = round(process_seconds(), 3)
        whole = (
            run.to_dict()
            | tally.counts()
            | {
                "total": len(job.item_ids),
                "rows_from_earlier_runs": kept,
                "startup_seconds": None if startup is None else round(startup, 3),
                "process_seconds": seconds,
                "startup_phases": milestones(),
            }
        )
        if not run.total:  # nothing was run: the last run's speed stands
            whole = with_last_measured(self.paths, whole)
        # The folder the job ran in: relative sources in its rows are relative to it.
        info = {**info, "output_format": self.format, "cwd": os.getcwd()}
        named = str(self.replaces) if self.replaces is not None else self.shown
        document = write_summary(self.paths, whole, info, named)
        report = JobReport(
            self.path, len(job.item_ids), kept, run, tally, self.paths.summary, job.notes
        )
        report.document = document
        report.startup_seconds, report.process_seconds = startup, seconds
        return report


def _restore_spool(paths: OutputPaths, shape: RowShape) -> None:
    """Recreate a columnar output's spool (what resume reads) from the output's rows when a
    finished job is run again, once its first row shows it is an output of this kind: a
    table that is not is left as it is."""
    spool = paths.spool
    if paths.spooled and not spool.exists() and paths.rows.exists():
        how = "it is left as it is: name another --out"
        try:
            rows = read_output(paths.rows)
            first = next(rows, None)
        except SourceError as exc:
            raise ConfigError(f"{exc}; {how}") from None
        if first is not None and not shape.is_row(first):
            raise ConfigError(f"{paths.rows} is not an mmbatch output of this kind; {how}")
        write_atomic(spool, chain([first] if first is not None else [], rows))


def _remove_orphans(paths: OutputPaths) -> None:
    """Remove the temporary files a job killed while writing its output, record, quarantine,
    summary or table left behind."""
    for path in paths.replaced:
        remove_orphans(path)
    if paths.spooled and paths.temporary.is_file():
        paths.temporary.unlink()


def _one_row_per_item(
    items: set[str], rows: list[dict[str, Any]], shape: RowShape
) -> dict[str, dict[str, Any]]:
    """The rows by item id, after checking that each item has exactly one."""
    by_id: dict[str, dict[str, Any]] = {}
    repeated = set()
    for row in rows:
        item_id = shape.row_id(row)
        if item_id in by_id:
            repeated.add(item_id)
        by_id[item_id] = row
    missing = sorted(items - by_id.keys())
    if repeated or missing:
        raise RuntimeError(
            f"bug: the output is not one row per input: {len(missing)} ids have no row "
            f"(e.g. {missing[:3]}), {len(repeated)} have several (e.g. {sorted(repeated)[:3]})"
        )
    return by_id
