"""The job of one ``Dataset``: its rows as requests, run by ``mmbatch.jobs.run_job`` into a
resumable output in a folder of its own, and its answers as an Arrow file of new columns
beside the dataset's (``mmbatch.integrations.dataset_runs`` says where, and why).

A job's folder is named by what it reads (the dataset's fingerprint, or the window of a
stream it holds) and by the task; it holds the job's rows (``rows.jsonl``, with the
summary, job record and quarantine beside them) and, once every row is there, the new
columns (``columns.arrow``), which are all a finished job is read back from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.early import EngineStart, begun_while_reading
from mmbatch.errors import ConfigError
from mmbatch.integrations.dataset_origin import DatasetOrigin
from mmbatch.integrations.hf_datasets import CellRows, DatasetMap
from mmbatch.jobs import FileOutput, Job, JobReport, fingerprint, run_job
from mmbatch.output.formats import read_output
from mmbatch.output.paths import OutputPaths
from mmbatch.pipeline import RunConfig
from mmbatch.row_schema import TOKEN_COLUMNS
from mmbatch.sources.cells import ROWS_PER_READ, column_cells
from mmbatch.types import Request

if TYPE_CHECKING:
    import datasets

JOB_VERSION = "1"
"""Bumped when a job folder's layout changes: an older folder is then another job's."""
COLUMNS_FILE = "columns.arrow"
ROWS_FILE = "rows.jsonl"
USAGE_COLUMNS = ("finish_reason", *TOKEN_COLUMNS)
"""The columns a task adds with ``with_usage=True``, after text and error."""


@dataclass(frozen=True)
class DatasetJob:
    """Where one dataset's job keeps its rows and its finished columns."""

    folder: Path

    @property
    def rows(self) -> Path:
        return self.folder / ROWS_FILE

    @property
    def columns(self) -> Path:
        return self.folder / COLUMNS_FILE


def run_table(
    dataset: datasets.Dataset,
    task: DatasetMap,
    origin: DatasetOrigin,
    root: Path,
    run: RunConfig | None,
    say: Callable[[JobReport], Sequence[str]] = JobReport.lines,
    identity: str | None = None,
) -> datasets.Dataset:
    """``run_dataset`` for a ``Dataset`` whose path cells follow ``origin``'s rule, its job
    in a folder under ``root`` named by ``identity`` (default: the dataset's fingerprint):
    loaded from there when it is finished, else run (resumed), and ``say``'s lines of its
    report printed."""
    import datasets

    _check_columns(task, dataset.column_names)
    identity = identity or dataset._fingerprint
    job_files = DatasetJob(root / job_name(identity, task))
    if not job_files.columns.is_file():
        # The engine starts while the rows become requests (each cell read, its paths
        # checked), for the column's media and the dataset's rows; a job that resumes
        # starts what is left once it knows what that is.
        written = FileOutput(job_files.rows).paths
        resumes = written.rows.exists() or written.progress.exists()
        media = None if resumes else {task.modality_of(dataset): 1}
        with begun_while_reading(_engine_config(task), media, dataset.num_rows) as engine:
            requests = dataset_requests(dataset, task, origin)
            report = run_task_job(requests, task, job_files.rows, identity, run, engine)
        for line in say(report):
            print(line, file=sys.stderr)
        rows = list(read_output(job_files.rows))
        _write_columns(job_files, task.columns(requests, rows, len(requests)))
    columns = cached_columns(job_files, task, identity, dataset.num_rows)
    return datasets.concatenate_datasets([dataset, columns], axis=1)


def dataset_requests(
    dataset: datasets.Dataset, task: DatasetMap, origin: DatasetOrigin
) -> list[Request]:
    """One request per row of ``dataset``, its index as id, by the path rule of its
    ``origin`` (said where it refused paths)."""
    rows = CellRows(task, origin, task.modality_of(dataset))
    prompts = _column(dataset, task.prompt_column) if task.prompt_column else None
    requests = [
        rows.request(str(index), f"row {index}", cell, next(prompts) if prompts else None)
        for index, cell in enumerate(column_cells(dataset, task.column))
    ]
    rows.say_refusals(len(requests))
    return requests


def run_task_job(
    requests: Sequence[Request],
    task: DatasetMap,
    out: Path,
    data_fingerprint: str,
    run: RunConfig | None,
    engine: EngineConfig | EngineStart | None = None,
) -> JobReport:
    """Run ``requests`` as ``task``'s job into the output ``out``, resumed where a killed
    run stopped, on ``engine`` (default: the task's, started once the rest is known); its
    report."""
    job = Job(
        requests,
        task.sampling,
        task.media,
        fingerprint=fingerprint(
            "run_dataset", task.model, task.sampling, task=task.fingerprint, data=data_fingerprint
        ),
        info={"dataset": data_fingerprint, "task": repr(task), "prompt": task.prompt},
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    return run_job(job, engine or _engine_config(task), FileOutput(out), run)


def _engine_config(task: DatasetMap) -> EngineConfig:
    """The engine ``task`` runs on."""
    return EngineConfig(task.model, dict(task.engine_kwargs), task.log_file())


def cached_columns(
    job_files: DatasetJob, task: DatasetMap, identity: str, rows: int
) -> datasets.Dataset:
    """The finished job's columns, once they are shown to be this job's: an Arrow file
    that reads whole, with one row per row of the dataset (``rows``) and the columns the
    task writes, beside the record of the job that ran ``task`` over ``identity``. Anything
    else (a file cut short, another job's, bytes that are no Arrow) is a ``ConfigError``
    naming the folder and how to run the job again."""
    import datasets

    try:
        columns = datasets.Dataset.from_file(str(job_files.columns))
    except Exception as exc:  # whatever pyarrow or datasets makes of bytes that are no Arrow
        raise _not_this_jobs(job_files, f"it cannot be read: {type(exc).__name__}") from None
    problem = _columns_problem(columns, task, rows) or _record_problem(job_files, task, identity)
    if problem:
        raise _not_this_jobs(job_files, problem)
    return columns


def _columns_problem(columns: datasets.Dataset, task: DatasetMap, rows: int) -> str | None:
    """Why ``columns`` are not what ``task`` writes for ``rows`` rows, if they are not."""
    import pyarrow as pa

    schema = columns.data.schema
    names = written_columns(task)
    if schema.names != names:
        return f"its columns are {', '.join(schema.names) or 'none'}, not {', '.join(names)}"
    if columns.num_rows != rows:
        return f"it holds {columns.num_rows} rows, the dataset {rows}"
    texts = [task.text_column, *(["finish_reason"] if task.with_usage else [])]
    for name in names:
        kind = schema.field(name).type
        if name in texts and task.sampling.n > 1:
            fits = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        elif name in texts or name == task.error_column:
            fits = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        else:
            fits = pa.types.is_integer(kind)
        if not fits:
            return f"its column {name!r} holds {kind}"
    return None


def _record_problem(job_files: DatasetJob, task: DatasetMap, identity: str) -> str | None:
    """Why the job record beside the columns is not that of ``task`` over ``identity``."""
    import json

    record = OutputPaths(job_files.rows).record
    try:
        stored = json.loads(record.read_text(encoding="utf-8"))["fingerprint"]
        facts = (stored["data"], stored["task"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"its job record {record.name} is missing or unreadable"
    if facts != (identity, task.fingerprint):
        return f"its job record {record.name} is another job's"
    return None


def _not_this_jobs(job_files: DatasetJob, why: str) -> ConfigError:
    return ConfigError(
        f"the finished job's columns {job_files.columns} are not this job's ({why}): "
        f"run again with run_dataset(..., load_from_cache_file=False), which replaces the "
        f"folder {job_files.folder}"
    )


def _write_columns(job_files: DatasetJob, columns: Mapping[str, list[Any]]) -> None:
    """The new columns as an Arrow file (datasets' stream format), written whole or not at
    all: a kill while writing leaves no file that would read as a finished job."""
    import pyarrow as pa

    table = pa.Table.from_pydict(dict(columns))
    partial = job_files.columns.with_name(f"{COLUMNS_FILE}.partial")
    with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(partial, job_files.columns)


def _column(dataset: datasets.Dataset, name: str) -> Iterator[Any]:
    for table in dataset.select_columns([name]).with_format("arrow").iter(ROWS_PER_READ):
        yield from table.column(0).to_pylist()


def _check_columns(task: DatasetMap, names: Sequence[str]) -> None:
    """A column the task reads that is missing, or one it writes that is there already,
    stops the job before anything runs."""
    for name in filter(None, (task.column, task.prompt_column)):
        if name not in names:
            raise ConfigError(f"the dataset has no column {name!r} (it has {', '.join(names)})")
    clash = [name for name in written_columns(task) if name in names]
    if clash:
        raise ConfigError(
            f"the dataset already has a column {clash[0]!r}, which the task writes: name "
            "another with DatasetMap(text_column=..., error_column=...), or remove it"
        )


def written_columns(task: DatasetMap) -> list[str]:
    """The columns ``task`` adds to a dataset, in order."""
    return [task.text_column, task.error_column, *(USAGE_COLUMNS if task.with_usage else ())]


def job_name(data_identity: str, task: DatasetMap) -> str:
    """The folder of the job running ``task`` over the data ``data_identity`` names."""
    key = f"{JOB_VERSION}:{data_identity}:{task.fingerprint}"
    return f"mmbatch-{xxhash.xxh3_64_hexdigest(key.encode())}"


def forget(folder: Path) -> None:
    """Start a job afresh (``load_from_cache_file=False``): its folder goes."""
    import shutil

    if folder.is_dir():
        shutil.rmtree(folder)
