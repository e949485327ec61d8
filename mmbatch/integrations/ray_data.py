"""Run a captioning job on Ray Data, for when one machine is not enough.

This module is the driver's side; each actor's (``EngineReplica``, and the settings it is
sent, ``RayJob``) is ``ray_replica``. The two are the only modules that import ray, and they
do so inside the functions that use it, so the command line can offer ``--ray`` without ray
installed and explain how to get it.

The flow on the cluster::

    input rows (id, path, prompt[, system])
      -> drop the ids already in the output folder (resume)
      -> media_group: each file's content key, in CPU tasks; only the key travels on
      -> groupby(media_group).map_groups(pack): one row per distinct picture, holding every
         request that uses it, so a picture's requests are never split across actor batches
      -> map_batches(EngineReplica): one vLLM engine per actor, each batch a ``Job`` run by
         the local runner (``mmbatch.jobs.run_in_memory``), one row per item, checked
      -> Ray's writer (JSON lines or Parquet) -> one row per input id, checked on the driver.

What the rows do not carry (requests answered by an identical request's answer, media
decoded) each replica tells a small actor of the job's (``ReplicaTally``) before it returns
a batch's rows, and the driver adds it to the counts it reads off the rows: the summary
says what a local run of the job says.

The driver resumes and reports with the local runner's own code, asking the output what
``run_job`` asks of it (``FileOutput.ready``, ``record``, ``run_stats`` and ``summarise``):
the job's fingerprint in ``OUT.job.json`` (another job's folder is refused unless forced),
ids already in the folder skipped, ``--retry-errors``, items whose prompt changed redone, a
file cut short set aside and redone, and the summary, the quarantine file and the exit code
counted over the whole folder. Before any of that, and before any actor
starts, it checks the engine settings as far as it can without a GPU; each actor then opens
its engine the way every face does (``mmbatch.engine.builder``: its own host read once, then
``start_engine``), its start-up log in the engine's log file and a failure said as a
``FatalEngineError``. Its engines run in engine processes of its own, as a local job's
do (``ReplicaEngine``): one that dies is started again inside the replica, and a request in
flight at two of its deaths becomes an error row, while the job goes on. A replica whose
own process dies Ray starts again, until it has died
twice in a row without finishing a batch (``replica_starts``): then the job stops, as on an
engine that does not start. A job stopped by
Ctrl-C (or SIGTERM) says what the folder holds, as the local runner does
(``say_interrupted``), and the command line shuts down the Ray it started (``connected``):
nothing the job started outlives it.

Why hash before the shuffle, and read the file again in the actor: the shuffle then moves a
32-character key per row instead of the picture's bytes. The key decides placement only;
the actor's loader hashes the bytes it reads itself, so a result can never be attached to a
key computed from a different file.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.clock import milestone, note_from
from mmbatch.engine.builder import check_engine_without_devices
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.logs import printed_to
from mmbatch.errors import ConfigError, FatalEngineError, MmbatchError
from mmbatch.integrations.ray_replica import EngineReplica, RayJob
from mmbatch.integrations.ray_rows import (
    GROUP_COLUMN,
    INPUT_COLUMNS,
    add_media_group,
    drop_ids,
    input_request,
    input_row,
    pack_group,
    read_parquet_rows,
    text_column,
)
from mmbatch.integrations.replica_tally import ReplicaTally, Tallied, startup_split
from mmbatch.jobs import Job, engine_stopped, say_interrupted
from mmbatch.media.options import ImageOptions
from mmbatch.output.file_output import FileOutput
from mmbatch.output.folders import folder_format
from mmbatch.output.summary import JobReport
from mmbatch.types import (
    Request,
    Restarts,
)

if TYPE_CHECKING:
    from ray.data import Dataset


INSTALL_HINT = "pip install 'mmbatch[ray]'"
ROWS_PER_INPUT_BLOCK = 512
"""Rows per block of a Dataset built from requests: enough files per hashing task that a
small job is not hundreds of tiny tasks, few enough that a large one spreads out."""
DEFAULT_BATCH_GROUPS = 256
"""Distinct pictures per actor batch; a batch holds every request of each of them. Ray Data
runs a few batches at once in an actor (its async concurrency, 4 by default), so that the
engine holds about a thousand requests: what an H200 runs at once for a 7B model."""


def import_ray() -> Any:
    """``ray`` with Ray Data loaded, or an ImportError that says how to install it."""
    try:
        import ray
        import ray.data  # Ray Data comes with the ray[data] extra's packages
    except ImportError as exc:
        raise ImportError(
            f"running on Ray needs ray with Ray Data ({exc}); install it with: {INSTALL_HINT}"
        ) from exc
    return ray


@dataclass(frozen=True)
class RayResources:
    """How the job is spread over the cluster."""

    replicas: int = 1
    """Actors, each with its own engine (a fixed pool: Ray Data's ``ActorPoolStrategy``)."""
    gpus_per_replica: float | None = None
    """GPUs per actor; None: the engine's tensor_parallel_size x pipeline_parallel_size, or
    0 where the driver has vLLM's CPU build. 0 runs on CPUs."""
    batch_groups: int = DEFAULT_BATCH_GROUPS
    shuffle_partitions: int | None = None
    """Partitions of the group-by shuffle; None: four per replica."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of the replicas (Ray's ``runtime_env``), e.g. VLLM_* settings."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.gpus_per_replica is not None and self.gpus_per_replica < 0:
            raise ConfigError(f"gpus_per_replica must be >= 0, got {self.gpus_per_replica}")
        if self.batch_groups < 1:
            raise ConfigError(f"batch_groups must be >= 1, got {self.batch_groups}")

    def num_gpus(self, engine: EngineConfig, cpu_build: bool | None = None) -> float:
        """GPUs per replica: as given, else none on vLLM's CPU build (``cpu_build``, found
        out from the vLLM installed here when None), else the engine's parallel size."""
        if self.gpus_per_replica is not None:
            return self.gpus_per_replica
        if cpu_build is None:
            from mmbatch.engine.installed_vllm import cpu_build as installed_cpu_build

            cpu_build = installed_cpu_build()
        if cpu_build:
            return 0.0
        kwargs = engine.engine_kwargs
        return float(
            int(kwargs.get("tensor_parallel_size", 1))
            * int(kwargs.get("pipeline_parallel_size", 1))
        )


class SettingsCheck:
    """``check_engine_without_devices`` run on a thread of its own while the caller starts
    Ray (the command line: vLLM's import and the model's config, then Ray's start, were
    seconds each, one after the other). ``wait`` says its verdict.

    The check runs off the main thread, not Ray: ``ray.init`` called on another thread
    leaves the main thread a connection to Ray's object store that fails at its first use
    (the process exits, in Ray's words, "The connection to the plasma store is failed")."""

    def __init__(self, config: EngineConfig) -> None:
        self.failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._check, args=(config,), name="settings-check", daemon=True
        )
        self._thread.start()

    def _check(self, config: EngineConfig) -> None:
        try:
            check_engine_without_devices(config)
            milestone("settings_checked")
        except BaseException as exc:  # said by ``wait``, on the caller's thread
            self.failure = exc

    def wait(self) -> None:
        """Block until the check is done; raise what it found."""
        self._thread.join()
        if self.failure is not None:
            raise self.failure


@contextmanager
def connected(address: str | None, log: str | None = None) -> Iterator[None]:
    """Ray for the length of the block: this process's connection where it has one (its
    caller's ``ray.init``, left as it is), else one made here to the cluster at ``address``
    (None: Ray's default, a running local cluster or a new one; ``local``: a new one) and
    shut down after the block however it ends. That stops a local Ray started here with the
    job; from a cluster it joined, the job only disconnects, which ends the actors and tasks
    the job started there and leaves the cluster be.

    ``ray.init`` takes SIGTERM over in the process that calls it: a Python handler that
    exits with code 15, then its core worker's own, which prints a C++ stack and aborts. The
    caller's handler is put back (the command line's: SIGTERM stops the job as Ctrl-C does,
    exit code 143), so that a job a scheduler stops says so and resumes as a local one.

    A Ray that cannot be reached or started (no cluster at ``auto``, an address that does
    not answer, a local Ray that fails to start) is a ``ConfigError`` in one line, before
    the job writes anything: Ray's own exception would be a traceback, and exit code 1,
    which says that some items failed. ``log``: where Ray's start-up lines go (the job's
    log file; None: the terminal)."""
    ray = import_ray()
    if ray.is_initialized():
        milestone("ray_initialised")
        yield
        return
    main_thread = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        # What Ray says as it starts, and what its workers print (in Ray's own log files),
        # go to ``log`` rather than the terminal; None: the terminal, workers' output too.
        with printed_to(log):
            ray.init(address=address or None, log_to_driver=log is None)
    except Exception as exc:
        with suppress(Exception):
            ray.shutdown()  # whatever it started before it failed
        raise ConfigError(ray_unreachable(address, exc)) from exc
    finally:
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)
    milestone("ray_initialised")
    try:
        yield
    finally:
        ray.shutdown()


def ray_unreachable(address: str | None, exc: Exception) -> str:
    """One line saying that Ray at ``address`` could not be reached or started, in Ray's
    words, and, for a cluster named by address, how to run on a Ray of the job's own."""
    reason = " ".join(str(exc).split()).rstrip(".") or "no reason given"
    said = f"{type(exc).__name__}: {reason}"
    if not address:
        return f"could not reach or start a local Ray: {said}"
    if address == "local":
        return f"could not start a local Ray: {said}"
    return (
        f"could not reach the Ray cluster at {address!r}: {said} (start one with "
        "`ray start --head`, or run on a Ray of the job's own with --ray local)"
    )


def requests_dataset(requests: Sequence[Request]) -> Dataset:
    """A Dataset of input rows from ``Request``s (one picture each), built on the driver."""
    ray = import_ray()
    rows = [input_row(request) for request in requests]
    blocks = max(1, -(-len(rows) // ROWS_PER_INPUT_BLOCK))
    return ray.data.from_items(rows, override_num_blocks=blocks)


def driver_requests(requests: Sequence[Request], job: RayJob) -> list[Request]:
    """The requests the driver plans, resumes and counts for ``requests_dataset(requests)``:
    what ``_whole_job`` would read back from that Dataset's rows, made from the same rows
    without running Ray Data to read them (seconds before any replica could start)."""
    rows = (input_row(request) for request in requests)
    return [
        input_request(
            row["id"], row["path"], row["prompt"], row["system"], default_prompt=job.prompt
        )
        for row in rows
    ]


def caption_dataset(
    ds: Dataset,
    job: RayJob,
    resources: RayResources,
    skip_ids: Iterable[str] = (),
    tally: Any | None = None,
) -> Dataset:
    """The lazy Dataset of output rows for the input rows of ``ds`` (minus ``skip_ids``):
    one row per input row, a caption or an error. ``tally``: a ``ReplicaTally`` actor the
    replicas tell what their rows do not say (``start_tally``)."""
    ray = import_ray()
    skip = sorted(set(skip_ids))
    if skip:
        ds = ds.map_batches(drop_ids, fn_kwargs={"skip": skip}, batch_format="pyarrow")
    partitions = resources.shuffle_partitions or 4 * resources.replicas
    packed = media_groups(ds, job.media.image, partitions)
    return packed.map_batches(
        EngineReplica,
        fn_constructor_args=(job, tally),
        batch_size=resources.batch_groups,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=resources.replicas),
        num_gpus=resources.num_gpus(job.engine),
        runtime_env={"env_vars": dict(resources.env)} if resources.env else None,
    )


def media_groups(ds: Dataset, options: ImageOptions, partitions: int) -> Dataset:
    """One row per distinct picture (by content key), holding list columns of every input
    row that uses it, so that those requests reach the same actor in the same batch."""
    from ray.data import Dataset
    from ray.data.context import ShuffleStrategy

    # Ray Data 2.60's default shuffle (SHUFFLE_V2) fails in its reduce step when a partition
    # gets only empty blocks, which a resume's filter makes; its sort-based shuffle does not,
    # and it runs as plain tasks. Set on a copy, so that the caller's dataset is unchanged.
    ds = Dataset.copy(ds, _deep_copy=True)
    ds.context.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    # A replica's error (an engine that did not start) reaches the driver as itself, whose
    # wording the driver keeps, not as Ray's UserCodeException.
    ds.context.raise_original_map_exception = True
    keyed = ds.map_batches(add_media_group, fn_kwargs={"options": options}, batch_format="pyarrow")
    grouped = keyed.groupby(GROUP_COLUMN, num_partitions=partitions)
    return grouped.map_groups(pack_group, batch_format="pyarrow")


def run_on_ray(
    ds: Dataset,
    job: RayJob,
    resources: RayResources,
    out: FileOutput | str | Path,
    items: Sequence[Request] | None = None,
) -> JobReport:
    """Caption the rows of ``ds`` into the folder ``out`` (of JSON-lines or Parquet files),
    resuming there with the local runner's rules, and check that every input id ends with
    exactly one row. ``items``: the input rows as requests, where the driver knows them
    without reading ``ds`` (a Parquet dataset's rows, from its ids alone; rows built by
    ``requests_dataset``, ``driver_requests``); None: read from ``ds`` by Ray Data."""
    ray = import_ray()
    out = replace(out if isinstance(out, FileOutput) else FileOutput.at(out), row_folder=True)
    _check_output(out, job)
    _check_resources(ray, resources.num_gpus(job.engine), resources.replicas)
    check_engine_without_devices(job.engine)
    whole = _whole_job(ds, job) if items is None else _whole(items, job)
    plan = out.ready(whole)
    out.record(whole)
    milestone("job_planned")
    started = time.perf_counter()
    pending = {r.row_id for r in plan.pending}
    job = replace(job, requests_per_replica=-(-len(plan.pending) // resources.replicas))
    told = Tallied()
    if pending:
        tally = start_tally(ray)
        try:
            # Ray Data's progress and its core worker's lines: into the engine's log.
            with printed_to(job.engine.log_file):
                rows = caption_dataset(ds, job, resources, whole.item_ids - pending, tally)
                _write(rows, out)
            told = _tallied(ray, tally)
        except ray.exceptions.RayError as exc:
            raise _stopped(exc, whole, out) from exc
        except KeyboardInterrupt:
            # Ray Data has been told to stop (its tasks cancelled, its actors let go) but may
            # not have yet: a writer may still add its file after this count, which is
            # therefore said as the least that is saved. A rerun counts again, and keeps
            # every row.
            with suppress(MmbatchError):
                out.refresh()
            say_interrupted(whole, out)
            raise
        finally:
            ray.kill(tally)
    out.refresh()
    startup, started = startup_split(told.ready_at, started)
    run = out.run_stats(whole, pending, started)  # one row per input, checked
    told.figures.add_to(run)
    run.cache = told.cache
    run.count_restarts(Restarts(*told.restarts, engines=resources.replicas))
    run.count_restarts(replace(told.engine_restarts, engines=resources.replicas))
    laid_out = {"engines": "; ".join(f"each replica: {layout}" for layout in told.layouts)}
    info = {**whole.info, **(laid_out if told.layouts else {})}
    return out.summarise(whole, plan, run, info, startup)


def _tallied(ray: Any, tally: Any) -> Tallied:
    """What the replicas told the job's tally; their start-up moments noted as the job's
    (``replica_N_...``)."""
    figures, layouts, ready_at, restarts, engine_restarts, cache, startups = ray.get(
        [
            tally.total.remote(),
            tally.layouts.remote(),
            tally.ready_at.remote(),
            tally.restarts.remote(),
            tally.engine_restarts.remote(),
            tally.caches.remote(),
            tally.startups.remote(),
        ]
    )
    for index, moments in enumerate(startups):
        note_from(f"replica_{index}", moments)
    return Tallied(figures, layouts, ready_at, tuple(restarts), engine_restarts, cache)


def _write(rows: Dataset, out: FileOutput) -> None:
    """Ray's writers put ``rows`` into the folder ``out``: on each node's own disk for a
    local folder (a file system every node shares), straight into the store for one in
    object storage, each file one PUT."""
    where, filesystem = str(out.path), None
    if out.url is not None:
        from mmbatch.storage.objects import arrow_file_system

        filesystem, where = arrow_file_system(out.url)
    if out.format == "parquet":
        rows.write_parquet(where, filesystem=filesystem)
    else:
        rows.write_json(where, filesystem=filesystem, force_ascii=False)


def start_tally(ray: Any) -> Any:
    """A ``ReplicaTally`` actor for one run; it holds no CPU, so it never waits for the
    replicas' resources, nor they for it."""
    return ray.remote(num_cpus=0)(ReplicaTally).remote()


def _check_output(out: FileOutput, job: RayJob) -> None:
    folder_format(out.format)
    if job.recipe is not None and out.format != "jsonl":
        raise ConfigError(
            "on Ray a recipe's rows are written as jsonl (their shape follows the recipe)"
        )
    if out.url is not None:
        from mmbatch.storage.objects import kind_of

        is_file = kind_of(out.url) == "object"
    else:
        is_file = out.path.exists() and not out.path.is_dir()
    if is_file:
        raise ConfigError(
            f"--out {out.shown} is a file; on Ray the output is a folder of {out.format} files"
        )


def _stopped(exc: Exception, whole: Job, out: FileOutput) -> MmbatchError:
    """What stopped the Ray job, as the local runner says it: a replica's own error with
    its wording (a setting its engine refused, an engine that did not start), else Ray's;
    either way with what the folder holds and how to go on."""
    cause = getattr(exc, "cause", None)
    with suppress(MmbatchError):
        out.refresh()  # what Ray's writers put in the store before it stopped
    if isinstance(cause, ConfigError):
        return ConfigError(_without_ray_note(cause))
    if isinstance(cause, FatalEngineError):
        return engine_stopped(FatalEngineError(_without_ray_note(cause)), whole, out)
    from mmbatch.storage.objects import redacted

    failed = FatalEngineError(f"the Ray job failed: {redacted(str(exc))}")
    return engine_stopped(failed, whole, out)


RAY_NOTE = "\nFailed to apply UDF transform after "
"""How Ray Data begins the note it appends to the message of an error it re-raises."""


def _without_ray_note(exc: Exception) -> str:
    return str(exc).split(RAY_NOTE, 1)[0]


def parquet_rows(
    files: Sequence[tuple[str, int]],
    image: str,
    id_column: str | None,
    prompt: str,
    system: str | None = None,
) -> Dataset:
    """Input rows for a dataset of Parquet files (``files``: each local path or storage URL
    with the index of its first row in the dataset), read by Ray's tasks (never by the
    driver), one file per task: the picture's bytes in ``data``, named by its row as a
    local run names it (``FILE#INDEX (NAME)``); the id the row's ``id_column`` or its
    index."""
    ray = import_ray()
    items = [{"file": file, "offset": offset} for file, offset in files]
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    kwargs = {"image": image, "id_column": id_column, "prompt": prompt, "system": system}
    return ds.map_batches(read_parquet_rows, fn_kwargs=kwargs, batch_size=1)


def _whole_job(ds: Dataset, job: RayJob) -> Job:
    """The job of every input row as the replicas run it (``RayJob.batch_job``), with the
    job's fingerprint and info: what resume and the summary read on the driver. The inputs
    must name each id once: an id names one output row."""
    names = set(ds.schema().names)
    missing = {"id", "path"} - names
    if missing:
        raise ConfigError(f"the input rows need the columns {sorted(missing)}")
    if "prompt" not in names and job.prompt is None:
        raise ConfigError("the input rows have no 'prompt' column and the job no default prompt")
    items: list[Request] = []
    seen: set[str] = set()
    present = [name for name in INPUT_COLUMNS if name in names]
    for batch in ds.select_columns(present).iter_batches(batch_format="pyarrow", batch_size=None):
        if batch["id"].null_count:
            raise ConfigError("every input row needs an id; an id names one output row")
        rows = zip(*(text_column(batch, name) for name in INPUT_COLUMNS), strict=True)
        batch_items = [input_request(*row, default_prompt=job.prompt) for row in rows]
        seen.update(item.id for item in batch_items)
        items += batch_items
        if len(seen) != len(items):
            raise ConfigError("input ids must be unique; an id names one output row")
    return _whole(items, job)


def _whole(items: Sequence[Request], job: RayJob) -> Job:
    return replace(job.batch_job(items), fingerprint=job.fingerprint, info=job.info)


def _check_resources(ray: Any, gpus: float, replicas: int = 1) -> None:
    """Refuse a job the cluster can never run: replicas that need more GPUs than it has and
    can get (the autoscaler's limit; none without an autoscaler), which would otherwise wait
    for GPUs forever. When the autoscaler can add them, say that the job waits for them."""
    if gpus <= 0:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    needed = gpus * replicas
    if needed <= have:
        return
    most = _most_gpus_possible()
    ask = (
        f"{replicas} replica(s) x {gpus:g} GPU(s) (tensor_parallel_size x "
        f"pipeline_parallel_size, or --gpus-per-replica) = {needed:g} GPU(s)"
    )
    if most is None or most < needed:
        can = "and no autoscaler to add more" if most is None else f"and can grow to {most:g}"
        raise ConfigError(
            f"{ask}, but the Ray cluster has {have:g} {can}: lower --replicas or "
            "--gpus-per-replica, join a cluster with the GPUs, or run on CPUs with "
            "--gpus-per-replica 0 (vLLM's CPU build)"
        )
    print(
        f"mmbatch: {ask}; the Ray cluster has {have:g} now and its autoscaler can add up to "
        f"{most:g}: the job waits for them",
        file=sys.stderr,
    )


def _most_gpus_possible() -> float | None:
    """The most GPUs the cluster's autoscaler may provide (None: no autoscaler)."""
    from ray._private.state import state

    try:
        most = state.get_max_resources_from_cluster_config()
    except Exception:  # a private API: if it moves, behave as if there were no autoscaler
        return None
    return None if most is None else float(most.get("GPU", 0))


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's vLLM settings (``VLLM_*``) and hub location, for the replicas: a remote
    worker does not inherit the driver's environment."""
    environ = os.environ if environ is None else environ
    keep = ("HF_HOME", "HF_HUB_OFFLINE")
    return {k: v for k, v in environ.items() if k.startswith("VLLM_") or k in keep}
