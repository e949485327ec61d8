"""The one job runner: every face (each command, ``DatasetMap``, a Ray replica) calls it.

    inputs -> plan -> resume -> pipeline -> sink -> summary

A face lists its requests (``mmbatch.sources``) and describes the work as a ``Job``: the
sampling, how media are decoded, the shape of its rows, and what makes two runs the same
job. ``run_job`` then

1. resumes: items that already have a row in the output are skipped (``mmbatch.output.resume``);
2. starts the engine only if something is left to do, sized for the media the job carries;
3. builds the loader with the engine's limits (the pre-flight budget, the model's audio
   rate), so that nothing flows back up from the engine to the face;
4. drives the pipeline, each row written as its item finishes;
5. counts the whole output (earlier runs' rows too), writes the quarantine file and the
   summary, and returns the report the face prints.

Steps 1 and 5 are ``plan_resume`` and ``summarize``, which Ray's driver calls too around the
work it spreads over the cluster (``mmbatch.integrations.ray_data``), with ``engine_stopped``
and ``say_interrupted`` for a job that stops early: one resume, one summary, one report,
whichever runs the items.

``run_in_memory`` is the same run without a file: the rows come back as a list, for
callers that own their output (a ``Dataset.map`` batch, a Ray replica's block).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.decode_only import NoEngine
from mmbatch.errors import ConfigError, FatalEngineError, OutputError, SourceError
from mmbatch.jsonl import remove_orphans, write_atomic
from mmbatch.media.decoders import start_decoders
from mmbatch.media.options import MediaOptions
from mmbatch.output.clock import milestone, milestones, process_seconds
from mmbatch.output.formats import check_shards, open_sink, output_format, read_output
from mmbatch.output.order import RowOrder
from mmbatch.output.paths import FileFormat, OutputPaths
from mmbatch.output.resume import ResumePlan, prepare, write_record, written_rows
from mmbatch.output.rows import FLAT, RowShape
from mmbatch.output.sinks import MemorySink, Sink
from mmbatch.output.stats import JobStats, OutputTally, count_output, format_counts
from mmbatch.output.summary import with_last_measured, write_summary
from mmbatch.output.writable import check_folder_writable, check_writable
from mmbatch.pipeline import RunConfig, Submission, pipeline_for, run_requests
from mmbatch.types import Modality, Request, Sampling


@dataclass(frozen=True)
class Job:
    """What to run: the requests and everything that shapes their answers and rows."""

    requests: Sequence[Request]
    sampling: Sampling = field(default_factory=Sampling)
    """The job's sampling; a request may carry its own (OpenAI batch lines do)."""
    media: MediaOptions = field(default_factory=MediaOptions)
    shape: RowShape = FLAT
    """How finished requests become rows, and how a written row is read back."""
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    """What makes two runs the same job (see ``fingerprint``): resuming another job's
    output is refused."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """What the summary records about the job (inputs, model, prompt, ...)."""
    notes: Sequence[str] = ()
    """What listing the inputs passed over or changed (``ListingLog.lines``), printed with
    the summary; the face records the details in ``info`` too."""

    @property
    def item_ids(self) -> set[str]:
        return {r.row_id for r in self.requests}


def fingerprint(command: str, model: str, sampling: Sampling, **task: Any) -> dict[str, Any]:
    """What makes two runs the same job: the command, the model (by name and by content:
    other weights at the same path are another model), sampling and the ``task`` settings
    (prompt, decode options). Each item's own prompt is checked row by row on resume
    (``mmbatch.output.resume``). Engine arguments are left out: they change speed and memory,
    and a user resuming on another machine must be able to change them."""
    from dataclasses import asdict

    from mmbatch.engine.identity import model_identity

    return {
        "command": command,
        "model": model,
        "model_content": model_identity(model),
        "sampling": asdict(sampling),
        **task,
    }


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

    def __post_init__(self) -> None:
        check_shards(self.format, self.shard_rows)

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
        **rerun: bool,
    ) -> FileOutput:
        """The output at ``path``, in ``format`` or the one its name implies."""
        return cls(Path(path), output_format(path, format), shard_rows=shard_rows, **rerun)


@dataclass
class JobReport:
    """What a run did, and what the whole output now holds."""

    out: Path
    total: int
    """The job's items."""
    kept: int
    """Items whose rows were already in the output, from earlier runs."""
    run: JobStats
    """This run's rows (nothing, when every item already had one)."""
    output: OutputTally
    """Every row of the job's items in the output, this run's and earlier ones'."""
    summary_path: Path
    notes: Sequence[str] = ()
    """What listing the inputs passed over or changed (``Job.notes``)."""
    startup_seconds: float | None = None
    """From the process's start to its engine ready (None: no engine was started)."""
    process_seconds: float = 0.0
    """From the process's start to the summary written."""

    @property
    def failed(self) -> int:
        return self.output.failed

    def lines(self) -> list[str]:
        """The summary a face prints at the end of the job."""
        lines = [self.run.summary()] if self.run.total else []
        if self.startup_seconds is not None:
            lines.append(
                f"start-up: {self.startup_seconds:.1f} s from the command to the engine ready; "
                f"{self.process_seconds:.1f} s in all"
            )
        lines.append(
            f"rows written to {self.out}: {self.output.ok} ok, {self.output.failed} failed; "
            f"summary in {self.summary_path}"
        )
        if self.output.quarantine is not None:
            kinds = format_counts(self.output.failed_by_kind)
            lines.append(f"failed inputs ({kinds}) listed in {self.output.quarantine}")
        return lines + [f"note: {note}" for note in self.notes]


def run_job(
    job: Job,
    engine: Engine | EngineConfig,
    out: FileOutput,
    run: RunConfig | None = None,
) -> JobReport:
    """Run the items of ``job`` that have no row in ``out`` yet, on ``engine`` (an engine, or
    the config of the vLLM engine to start if anything is left to do)."""
    run = run or RunConfig()
    milestone("inputs_listed")
    _check_layout(engine)  # a configuration mistake stops the job before any output
    job = _with_invariance(job, engine)
    log = engine.log_file if isinstance(engine, EngineConfig) else None
    plan = plan_resume(job, out, Path(log) if log else None)
    # The engine starts before anything is written: a setting it refuses leaves no output.
    info = dict(job.info)
    live, startup = _started(engine, plan.pending, info, run)
    write_record(out.paths.record, job.fingerprint)
    stats = JobStats()
    # With nothing left to run, the rows are still put in input order: a job killed between
    # its last row and that rewrite left them in the order they finished.
    progress = out.paths.progress
    if plan.pending or progress != out.path or progress.exists():
        stats = _write_rows(job, out, plan.pending, live, run)
    return summarize(job, out, plan, stats, info, startup)


def plan_resume(job: Job, out: FileOutput, log: Path | None = None) -> ResumePlan:
    """Make ``out`` ready for ``job`` before anything starts (decode workers, engines, vLLM's
    import), and return what is left to do: the files the job writes can be made (``log``:
    vLLM's, appended to), a killed run's temporary files go, and the rows already there are
    checked and kept (``mmbatch.output.resume``), which is said. The job record is the caller's
    to write (``write_record``), once the job is sure to start."""
    paths = out.paths
    check_writable(paths.rows, [paths.progress, log])
    if job.media.frame_dir is not None:
        check_folder_writable(Path(job.media.frame_dir), "the saved frames (--save-frames)")
    _remove_orphans(paths)
    _restore_spool(paths, job.shape)
    plan = prepare(paths, job, force=out.force, retry_errors=out.retry_errors)
    note = plan.describe(out.path)
    if note:
        print(f"mmbatch: {note}", file=sys.stderr)
    return plan


def summarize(
    job: Job,
    out: FileOutput,
    plan: ResumePlan,
    stats: JobStats,
    info: Mapping[str, Any],
    startup: float | None = None,
) -> JobReport:
    """Count every row of ``job``'s items in ``out`` (earlier runs' too), write the
    quarantine file and the summary (with this run's ``stats`` and what ``info`` says of the
    job), and return the report a face prints."""
    try:
        return _report(job, out, plan, stats, info, startup)
    except OutputError as exc:
        raise OutputError(
            f"{exc}; every row is in {out.path}: free space and run the same command again "
            "to write the summary"
        ) from exc


def engine_stopped(exc: FatalEngineError, job: Job, out: FileOutput) -> FatalEngineError:
    """``exc``, saying what ``out`` holds now and how to go on: the rows finished are kept,
    and the same command resumes."""
    tally = _count(out, job)
    left = len(job.item_ids) - tally.done
    return FatalEngineError(
        f"{exc}\nThe {tally.done} rows finished are saved in {out.path} "
        f"({left} items left); run the same command again to resume."
    )


def say_interrupted(job: Job, out: FileOutput) -> None:
    """Say what ``out`` holds once Ctrl-C (or SIGTERM, which the command line turns into it)
    stopped ``job``: the rows finished are kept; the face then says to run it again.

    A row folder's writers are Ray's, which stop in the background: one may still finish
    its file after this count (and a file it is writing is left to it, not set aside), so
    the count is said as the least that is saved. The rerun counts again and keeps them."""
    settled = not out.row_folder
    tally = _count(out, job, settled)
    done, left = tally.done, len(job.item_ids) - tally.done
    saved = (
        f"{done} rows are saved in {out.path} ({left} items left)"
        if settled
        else f"at least {done} rows are saved in {out.path} (at most {left} items left; "
        "Ray's writers, still stopping, may add the rows they hold)"
    )
    print(f"mmbatch: interrupted: {saved}", file=sys.stderr)


def _write_rows(
    job: Job, out: FileOutput, pending: Sequence[Request], engine: Engine | None, run: RunConfig
) -> JobStats:
    """Run ``pending`` on ``engine`` (None: nothing to run, the output is only rewritten)
    into ``out``, whose sink is closed however the run ends: the rows finished are kept, and
    what stopped the job says how to go on."""
    order = RowOrder([r.row_id for r in job.requests], job.shape.row_id)
    sink = open_sink(out.path, out.format, True, order, out.shard_rows)
    try:
        stats = _run(job, pending, engine, sink, run) if engine is not None else JobStats()
        sink.close()
        return stats
    except FatalEngineError as exc:
        sink.close()
        raise engine_stopped(exc, job, out) from exc
    except KeyboardInterrupt:
        sink.close()  # every row written is made durable; the record says whose they are
        say_interrupted(job, out)
        raise
    except OutputError as exc:
        with suppress(OutputError):
            sink.close()  # the disk may still be full: what is written stays written
        raise OutputError(
            f"{exc}; the rows finished so far are kept: free space (or make the folder "
            "writable) and run the same command again to resume"
        ) from exc


def run_in_memory(
    job: Job, engine: Engine, run: RunConfig | None = None
) -> tuple[list[dict[str, Any]], JobStats]:
    """Run every request of ``job`` on ``engine``; the rows, one per item in input order,
    and the run's stats. The engine's pipeline (its feeder, its decoded media) is kept for
    the next call, so batch after batch costs no start-up."""
    rows, stats = rows_of(start_in_memory(job, engine, run))
    return RowOrder([r.row_id for r in job.requests], job.shape.row_id).sorted(rows), stats


def start_in_memory(job: Job, engine: Engine, run: RunConfig | None = None) -> Submission:
    """``run_in_memory`` without the wait: the submission, to wait on (``rows_of``) from any
    thread or event loop, while other submissions keep the engine busy."""
    run = run or RunConfig(progress=False)
    requests = list(job.requests)
    return pipeline_for(engine, run).submit(
        requests, job.sampling, job.media, job.shape.builder(requests), MemorySink(), run.progress
    )


def rows_of(submission: Submission) -> tuple[list[dict[str, Any]], JobStats]:
    """The rows and stats of a finished in-memory submission (waiting for it first), in
    the order their items finished."""
    stats = submission.wait()
    assert isinstance(submission.sink, MemorySink)
    return submission.sink.rows, stats


def media_per_prompt(requests: Sequence[Request]) -> dict[Modality, int]:
    """The most items of each modality any one request carries (``{"image": 1}`` for none):
    the engine reserves memory only for the media the job sends."""
    limits: dict[Modality, int] = {}
    for request in requests:
        if request.error is not None:
            continue  # never sent: a model that cannot take it must not be asked to
        counts: dict[Modality, int] = {}
        for ref in request.media:
            counts[ref.modality] = counts.get(ref.modality, 0) + 1
        for modality, count in counts.items():
            limits[modality] = max(limits.get(modality, 0), count)
    return limits or {"image": 1}


def _run(
    job: Job, requests: Sequence[Request], engine: Engine, sink: Sink, run: RunConfig
) -> JobStats:
    pending = list(requests)
    rows = job.shape.builder(pending)
    return run_requests(pending, engine, job.media, sink, job.sampling, run, rows)


def _check_layout(engine: Engine | EngineConfig) -> None:
    """``ConfigError`` for engine settings the host cannot lay out (a missing model folder,
    more GPUs than there are), before anything is written."""
    if isinstance(engine, EngineConfig):
        from mmbatch.engine.builder import host_layout

        host_layout(engine)


def _with_invariance(job: Job, engine: Engine | EngineConfig) -> Job:
    """``job``, its record and summary saying that its engine decodes batch-invariantly
    (``mmbatch.engine.invariance``), once the host is known to give it (``ConfigError``
    where it cannot: before any output). A resumed job must run as it began: its rows are
    then those of one uninterrupted run."""
    if not isinstance(engine, EngineConfig) or not engine.batch_invariant:
        return job
    from mmbatch.engine.invariance import prepare_batch_invariance, recorded

    prepare_batch_invariance(engine)
    print(
        "mmbatch: batch-invariant decoding (VLLM_BATCH_INVARIANT=1): each answer is the same "
        "whatever it is batched with, on this GPU model, vLLM version and settings",
        file=sys.stderr,
    )
    mark = recorded(engine)
    return replace(job, fingerprint={**job.fingerprint, **mark}, info={**job.info, **mark})


def _started(
    engine: Engine | EngineConfig, pending: Sequence[Request], info: dict[str, Any], run: RunConfig
) -> tuple[Engine | None, float | None]:
    """The engine to run ``pending`` on (None: nothing is pending), with the decode workers,
    and the seconds from the process's start to it being ready (None: nothing started).
    Requests that were all refused while listing (their rows are their errors) start
    nothing: a minute of engine start-up for no answer."""
    if not pending:
        return None, None
    if all(request.error is not None for request in pending):
        print(
            f"mmbatch: none of the {len(pending)} requests left can run (each was refused "
            "while listing: its row says why); no engine started",
            file=sys.stderr,
        )
        return NoEngine(), None
    start_decoders(run.workers())  # they start while the engine loads
    live = _engine(engine, pending, info)
    startup = process_seconds()
    milestone("engines_ready")
    return live, startup


def _engine(
    engine: Engine | EngineConfig, requests: Sequence[Request], info: dict[str, Any]
) -> Engine:
    """``engine``, or the engine(s) ``engine`` describes, built for the host's GPUs and sized
    for the work left (a small job: one engine per GPU); the layout chosen, and why, goes to
    the summary (and is said at once)."""
    if not isinstance(engine, EngineConfig):
        return engine
    from mmbatch.engine.builder import host_layout
    from mmbatch.engine.registry import shared_engine_and_layout

    layout = host_layout(engine, len(requests))
    built, layout = shared_engine_and_layout(engine, media_per_prompt(requests), layout)
    info["engines"] = layout.describe()
    print(f"mmbatch: {layout.describe()}", file=sys.stderr)
    return built


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


def _count(out: FileOutput, job: Job, settled: bool = True) -> OutputTally:
    paths = out.paths
    rows = written_rows(paths, job.shape, settled)
    return count_output(rows, job.shape, job.item_ids, paths.quarantine)


def _report(
    job: Job,
    out: FileOutput,
    plan: ResumePlan,
    stats: JobStats,
    info: Mapping[str, Any],
    startup: float | None,
) -> JobReport:
    tally = _count(out, job)
    kept = plan.kept_ok + plan.kept_failed
    seconds = round(process_seconds(), 3)
    whole = (
        stats.to_dict()
        | tally.counts()
        | {
            "total": len(job.item_ids),
            "rows_from_earlier_runs": kept,
            "startup_seconds": None if startup is None else round(startup, 3),
            "process_seconds": seconds,
            "startup_phases": milestones(),
        }
    )
    if not stats.total:  # nothing was run: the last run's speed stands
        whole = with_last_measured(out.paths, whole)
    # The folder the job ran in: relative sources in its rows are relative to it.
    info = {**info, "output_format": out.format, "cwd": os.getcwd()}
    summary = write_summary(out.paths, whole, info)
    report = JobReport(out.path, len(job.item_ids), kept, stats, tally, summary, job.notes)
    report.startup_seconds, report.process_seconds = startup, seconds
    return report
