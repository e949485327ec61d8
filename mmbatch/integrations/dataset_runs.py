"""``mmbatch.run_dataset(ds, task)``: a whole Hugging Face dataset as one job.

``ds.map(DatasetMap(...))`` answers batch by batch: each batch is planned alone and drains
the engine before the next arrives, and the engine is laid out without knowing the job's
size. ``run_dataset`` hands the whole dataset to the runner that ``mmbatch caption`` uses
(``mmbatch.jobs.run_job``) instead: one plan over every row (shared media and prompts
together, identical requests answered once), the engine layout chosen for the job's size,
each row's answer kept as it finishes in a resumable output, a summary at the end. Its
rows are ``DatasetMap``'s: the same columns, the same texts, the same path rule.

The job lives in a folder of its own beside the dataset's Arrow files, as datasets keeps a
``map``'s cache (``cache_dir`` elsewhere; a dataset held in memory: datasets' cache folder),
named by the dataset's fingerprint and the task's. So

* a job killed at any moment resumes where it stopped when called again, no row done twice;
* once done, the new columns are an Arrow file there, and the same call with the same data
  and settings loads them without starting an engine (``load_from_cache_file``, as
  ``Dataset.map``'s: by default, whether datasets' caching is enabled).

The dataset's own columns are not copied: the result is the dataset with the new columns
beside it (``concatenate_datasets(axis=1)``), memory-mapped as the dataset is.

A streaming dataset (``IterableDataset``) is read once, in windows of rows, so that memory
holds a window's media, not the dataset's (``mmbatch.integrations.dataset_streams``).
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
from mmbatch.errors import ConfigError
from mmbatch.integrations.dataset_origin import DatasetOrigin, origin_of
from mmbatch.integrations.hf_datasets import CellRows, DatasetMap
from mmbatch.jobs import FileOutput, Job, JobReport, fingerprint, run_job
from mmbatch.output.formats import read_output
from mmbatch.pipeline import RunConfig
from mmbatch.sources.cells import ROWS_PER_READ, column_cells
from mmbatch.types import Request

if TYPE_CHECKING:
    import datasets

JOB_VERSION = "1"
"""Bumped when a job folder's layout changes: an older folder is then another job's."""
COLUMNS_FILE = "columns.arrow"
ROWS_FILE = "rows.jsonl"


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


def run_dataset(
    dataset: datasets.Dataset | datasets.IterableDataset,
    task: DatasetMap,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    load_from_cache_file: bool | None = None,
    run: RunConfig | None = None,
) -> datasets.Dataset:
    """``dataset`` with ``task``'s new columns (``text``, ``error``, ...), every row run as
    one job: planned together, on engines laid out for its size, resumable, cached.

    ``cache_dir``: where the job's folder goes (default: beside the dataset's files);
    ``load_from_cache_file``: reuse a finished job's columns (default: whether datasets'
    caching is enabled); ``run``: progress bar, decode workers, media memory."""
    import datasets

    if load_from_cache_file is None:
        load_from_cache_file = datasets.is_caching_enabled()
    if isinstance(dataset, datasets.IterableDataset):
        from mmbatch.integrations.dataset_streams import run_stream

        root = _folder_root(None, cache_dir)
        return run_stream(dataset, task, root, run, load_from_cache_file)
    root = _folder_root(dataset, cache_dir)
    if not load_from_cache_file:
        forget(root / job_name(dataset._fingerprint, task))
    return run_table(dataset, task, origin_of(dataset), root, run)


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
    _check_columns(task, dataset.column_names)
    identity = identity or dataset._fingerprint
    job_files = DatasetJob(root / job_name(identity, task))
    if not job_files.columns.is_file():
        requests = dataset_requests(dataset, task, origin)
        report = run_task_job(requests, task, job_files.rows, identity, run)
        for line in say(report):
            print(line, file=sys.stderr)
        rows = list(read_output(job_files.rows))
        _write_columns(job_files, task.columns(requests, rows, len(requests)))
    return with_columns(dataset, job_files.columns)


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
) -> JobReport:
    """Run ``requests`` as ``task``'s job into the output ``out``, resumed where a killed
    run stopped; its report."""
    job = Job(
        requests,
        task.sampling,
        task.media,
        fingerprint=fingerprint(
            "run_dataset", task.model, task.sampling, task=task.fingerprint, data=data_fingerprint
        ),
        info={"dataset": data_fingerprint, "task": repr(task), "prompt": task.prompt},
    )
    engine = EngineConfig(task.model, dict(task.engine_kwargs), task.log_file())
    out.parent.mkdir(parents=True, exist_ok=True)
    return run_job(job, engine, FileOutput(out), run)


def with_columns(dataset: datasets.Dataset, columns: Path) -> datasets.Dataset:
    """``dataset`` with the columns of the Arrow file ``columns`` beside its own."""
    import datasets

    return datasets.concatenate_datasets(
        [dataset, datasets.Dataset.from_file(str(columns))], axis=1
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
    written = [task.text_column, task.error_column]
    if task.with_usage:
        written += ["finish_reason", "prompt_tokens", "output_tokens", "cached_tokens"]
    clash = [name for name in written if name in names]
    if clash:
        raise ConfigError(
            f"the dataset already has a column {clash[0]!r}, which the task writes: name "
            "another with DatasetMap(text_column=..., error_column=...), or remove it"
        )


def _folder_root(
    dataset: datasets.Dataset | None, cache_dir: str | os.PathLike[str] | None
) -> Path:
    """Where job folders go: ``cache_dir``, else beside the dataset's Arrow files (as
    datasets keeps a ``map``'s cache), else datasets' cache folder."""
    if cache_dir is not None:
        return Path(cache_dir)
    if dataset is not None and dataset.cache_files:
        return Path(dataset.cache_files[0]["filename"]).parent
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "mmbatch"


def job_name(data_identity: str, task: DatasetMap) -> str:
    """The folder of the job running ``task`` over the data ``data_identity`` names."""
    key = f"{JOB_VERSION}:{data_identity}:{task.fingerprint}"
    return f"mmbatch-{xxhash.xxh3_64_hexdigest(key.encode())}"


def forget(folder: Path) -> None:
    """Start a job afresh (``load_from_cache_file=False``): its folder goes."""
    import shutil

    if folder.is_dir():
        shutil.rmtree(folder)
