"""``mmbatch.run_dataset(ds, task)``: a whole Hugging Face dataset as one job.

``ds.map(DatasetMap(...))`` answers batch by batch: each batch is planned alone (the next
one only guessed ahead, ``mmbatch.integrations.lookahead``), and the engine is laid out
without knowing the job's size. ``run_dataset`` hands the whole dataset to the runner
that ``mmbatch caption`` uses (``mmbatch.jobs.run_job``) instead: one plan over every row
(shared media and prompts together, identical requests answered once), the engine layout
chosen for the job's size, each row's answer kept as it finishes in a resumable output, a
summary at the end. Its rows are ``DatasetMap``'s: the same columns, the same texts, the
same path rule.

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
from pathlib import Path
from typing import TYPE_CHECKING

from mmbatch.integrations.dataset_origin import origin_of
from mmbatch.integrations.dataset_streams import run_stream
from mmbatch.integrations.dataset_tables import forget, job_name, run_table
from mmbatch.integrations.hf_datasets import DatasetMap
from mmbatch.pipeline import RunConfig

if TYPE_CHECKING:
    import datasets


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
        root = _folder_root(None, cache_dir)
        return run_stream(dataset, task, root, run, load_from_cache_file)
    root = _folder_root(dataset, cache_dir)
    if not load_from_cache_file:
        forget(root / job_name(dataset._fingerprint, task))
    return run_table(dataset, task, origin_of(dataset), root, run)


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
