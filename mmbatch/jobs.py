"""The one job runner: every face (each command, ``DatasetMap``, a Ray replica) calls it.

    inputs -> plan -> resume -> pipeline -> sink -> summary

A face lists its requests (``mmbatch.sources``) and describes the work as a ``Job``: the
sampling, how media are decoded, the shape of its rows, and what makes two runs the same
job. ``run_job`` then

1. resumes: items that already have a row in the output are skipped (``FileOutput.ready``,
   ``mmbatch.output.resume``);
2. starts the engine only if something is left to do, sized for the media the job carries;
3. builds the loader with the engine's limits (the pre-flight budget, the model's audio
   rate), so that nothing flows back up from the engine to the face;
4. drives the pipeline, each row written as its item finishes;
5. counts the whole output (earlier runs' rows too), writes the quarantine file and the
   summary, and returns the report the face prints.

Steps 1 and 5, and what comes between (the job record, the sink, the count), are what a
run asks of its output, ``FileOutput`` (``mmbatch.output.file_output``); Ray's driver asks
the same of it around the work it spreads over the cluster
(``mmbatch.integrations.ray_data``), with ``engine_stopped`` and ``say_interrupted`` for a
job that stops early: one resume, one summary, one report, whichever runs the items.

``run_in_memory`` is the same run without a file: the rows come back as a list, for
callers that own their output (a ``Dataset.map`` batch, a Ray replica's block).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.clock import milestone, process_seconds
from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.decode_only import DecodeOnly, NoEngine
from mmbatch.errors import FatalEngineError, OutputError, StorageError, StorageUnavailable
from mmbatch.media.decoders import start_decoders
from mmbatch.media.options import MediaOptions
from mmbatch.output.file_output import FileOutput as FileOutput  # run_job's, re-exported
from mmbatch.output.order import RowOrder
from mmbatch.output.rows import FLAT, RowShape
from mmbatch.output.sinks import MemorySink, Sink
from mmbatch.output.stats import JobStats
from mmbatch.output.summary import JobReport as JobReport  # run_job's, re-exported
from mmbatch.output.writable import check_folder_writable
from mmbatch.pipeline import RunConfig, Submission, pipeline_for, run_requests
from mmbatch.types import Modality, Request, Sampling
from mmbatch.words import agreeing, counted

if TYPE_CHECKING:
    from mmbatch.engine.builder import Host
    from mmbatch.engine.early import EngineStart


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

    def first(self, items: int) -> Job:
        """This job cut to its first ``items`` items in listing order, every request of each
        (a recipe's questions) kept: a trial before the whole job. Still the same job
        (its fingerprint unchanged): a later run of the whole job keeps these rows and goes
        on with the rest."""
        kept: set[str] = set()
        requests = []
        for request in self.requests:
            if request.row_id not in kept:
                if len(kept) == items:
                    continue
                kept.add(request.row_id)
            requests.append(request)
        return replace(self, requests=requests, info={**self.info, "limit": items})


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


def run_job(
    job: Job,
    engine: Engine | EngineConfig | EngineStart,
    out: FileOutput,
    run: RunConfig | None = None,
) -> JobReport:
    """Run the items of ``job`` that have no row in ``out`` yet, on ``engine`` (an engine,
    the config of the vLLM engine to start if anything is left to do, or that engine's
    start, begun while the face read its inputs: ``mmbatch.engine.early``)."""
    from mmbatch.engine.early import EngineStart

    run = run or RunConfig()
    milestone("inputs_listed")
    try:
        return _run_job(job, _read_host(engine), out, run)
    finally:
        if isinstance(engine, EngineStart) and not engine.taken:
            engine.close()  # begun, and not needed: nothing left to run, or a mistake


def _run_job(
    job: Job, laid_out: Engine | Host | EngineStart, out: FileOutput, run: RunConfig
) -> JobReport:
    job = _with_invariance(job, laid_out)
    log = _log_file(laid_out)
    if job.media.frame_dir is not None:  # found now, not as every frame's failure
        check_folder_writable(Path(job.media.frame_dir), "the saved frames (--save-frames)")
    plan = out.ready(job, Path(log) if log else None)
    # The engine starts before anything is written: a setting it refuses leaves no output.
    info = dict(job.info)
    live, startup = _started(laid_out, plan.pending, info, run)
    out.record(job)
    stats = JobStats()
    # With nothing left to run, the rows are still put in input order: a job killed between
    # its last row and that rewrite left them in the order they finished.
    progress = out.paths.progress
    if plan.pending or progress != out.path or progress.exists():
        stats = _write_rows(job, out, plan.pending, live, run)
    report = out.summarise(job, plan, stats, info, startup)
    report.model = not isinstance(live, DecodeOnly)  # frames only extracted: no tokens
    return report


def engine_stopped(exc: FatalEngineError, job: Job, out: FileOutput) -> FatalEngineError:
    """``exc``, saying what ``out`` holds now and how to go on: the rows finished are kept,
    and the same command resumes."""
    tally = out.count(job)
    done, left = tally.done, len(job.item_ids) - tally.done
    return FatalEngineError(
        f"{exc}\nThe {counted(done, 'row')} finished {agreeing(done, 'is', 'are')} saved in "
        f"{out.shown} ({counted(left, 'item')} left); run the same command again to resume."
    )


def say_interrupted(job: Job, out: FileOutput) -> None:
    """Say what ``out`` holds once Ctrl-C (or SIGTERM, which the command line turns into it)
    stopped ``job``: the rows finished are kept; the face then says to run it again.

    A row folder's writers are Ray's, which stop in the background: one may still finish
    its file after this count (and a file it is writing is left to it, not set aside), so
    the count is said as the least that is saved. The rerun counts again and keeps them."""
    settled = not out.row_folder
    tally = out.count(job, settled)
    done, left = tally.done, len(job.item_ids) - tally.done
    rows, items = f"{counted(done, 'row')} {agreeing(done, 'is', 'are')}", counted(left, "item")
    saved = (
        f"{rows} saved in {out.shown} ({items} left)"
        if settled
        else f"at least {rows} saved in {out.shown} (at most {items} left; "
        "Ray's writers, still stopping, may add the rows they hold)"
    )
    print(f"mmbatch: interrupted: {saved}", file=sys.stderr)


def _write_rows(
    job: Job, out: FileOutput, pending: Sequence[Request], engine: Engine | None, run: RunConfig
) -> JobStats:
    """Run ``pending`` on ``engine`` (None: nothing to run, the output is only rewritten)
    into ``out``, whose sink is closed however the run ends: the rows finished are kept, and
    what stopped the job says how to go on."""
    sink = out.open(job)
    try:
        stats = _run(job, pending, engine, sink, run) if engine is not None else JobStats()
        sink.close()
        return stats
    except FatalEngineError as exc:
        # Closed as far as it can be: an output in storage that cannot be reached now keeps
        # the parts already written, and what stopped the job is what is said.
        with suppress(OutputError, StorageError, StorageUnavailable):
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
    except StorageError as exc:
        with suppress(OutputError, StorageError, StorageUnavailable):
            sink.close()
        raise StorageError(
            f"{exc}; the rows finished so far are kept in {out.shown}: fix the cause and run "
            "the same command again to resume"
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


def _read_host(engine: Engine | EngineConfig | EngineStart) -> Engine | Host | EngineStart:
    """``engine``, or the host the engine(s) ``engine`` describes will run on, checked:
    ``ConfigError`` for settings the host cannot lay out (a missing model folder, more GPUs
    than there are), before anything is written (an engine's start read it as it began)."""
    if not isinstance(engine, EngineConfig):
        return engine
    from mmbatch.engine.builder import read_host

    return read_host(engine)


def _host_of(engine: Engine | Host | EngineStart) -> Engine | Host:
    """The host an engine's start read, else ``engine``."""
    from mmbatch.engine.early import EngineStart

    return engine.host if isinstance(engine, EngineStart) else engine


def _log_file(engine: Engine | Host | EngineStart) -> str | None:
    """Where the engine's log goes (None: nowhere of this job's)."""
    from mmbatch.engine.builder import Host

    host = _host_of(engine)
    return host.config.log_file if isinstance(host, Host) else None


def _with_invariance(job: Job, engine: Engine | Host | EngineStart) -> Job:
    """``job``, its record and summary saying that its engine decodes batch-invariantly
    (``mmbatch.engine.invariance``), once the host (as the job read it) is known to give it
    (``ConfigError`` where it cannot: before any output). A resumed job must run as it
    began: its rows are then those of one uninterrupted run."""
    from mmbatch.engine.builder import Host

    engine = _host_of(engine)
    if not isinstance(engine, Host) or not engine.config.batch_invariant:
        return job
    from mmbatch.engine.invariance import prepare_batch_invariance, recorded

    prepare_batch_invariance(engine.config, engine.gpus)
    print(
        "mmbatch: batch-invariant decoding (VLLM_BATCH_INVARIANT=1): each answer is the same "
        "whatever it is batched with, on this GPU model, vLLM version and settings",
        file=sys.stderr,
    )
    mark = recorded(engine.config)
    return replace(job, fingerprint={**job.fingerprint, **mark}, info={**job.info, **mark})


def _started(
    engine: Engine | Host | EngineStart,
    pending: Sequence[Request],
    info: dict[str, Any],
    run: RunConfig,
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
    engine: Engine | Host | EngineStart, requests: Sequence[Request], info: dict[str, Any]
) -> Engine:
    """``engine``, or the engine(s) for ``engine``'s host, laid out for the work left (a
    small job: one engine per GPU; an engine begun early: for the job's size as its face
    counted it); the layout chosen, and why, goes to the summary (and is said at once)."""
    from mmbatch.engine.builder import Host
    from mmbatch.engine.early import EngineStart
    from mmbatch.engine.registry import shared_engine_and_layout
    from mmbatch.engine.startup_line import StartupLine

    media = media_per_prompt(requests)
    if isinstance(engine, EngineStart):
        with StartupLine(engine.host.config.log_file, engine.layout.replicas):
            built, layout = engine.engine(media)
        config = engine.host.config
    elif isinstance(engine, Host):
        layout = engine.layout(len(requests))
        with StartupLine(engine.config.log_file, layout.replicas):
            built, layout = shared_engine_and_layout(engine, media, layout)
        config = engine.config
    else:
        return engine
    info["engines"] = layout.describe()
    print(f"mmbatch: {layout.plainly()}", file=sys.stderr)
    if config.log_file is None:  # -v: the reasons beside vLLM's own log
        print(f"mmbatch: engines: {layout.describe()}", file=sys.stderr)
    return built
