"""Where a Hugging Face dataset's rows came from, and so which local paths its cells may name.

A media cell that holds only a path (``{bytes: None, path}``, or a string) is a file to read
from this machine. Whether that is safe depends on who wrote the path:

* **A folder the person listed** — one that datasets' folder builders made by listing a
  folder (``imagefolder``, ``audiofolder``, ``videofolder``): its paths are the files the
  builder found there (datasets itself refuses a metadata ``file_name`` that leaves the
  folder), held to the rule a folder walk of ``mmbatch caption`` follows
  (``LocalPaths.listed``): a link among them that leads out of the folder listed is its
  row's error, for the reason the command passes it over.
* **The person's own dataset** — one built in memory by a Python call in this process
  (``Dataset.from_dict``, ``from_list``, ``from_pandas``) or from the caller's own generator
  (``Dataset.from_generator``): its paths are what that call was given, read wherever they
  lead. A saved dataset (``save_to_disk``) holds its media's bytes, not paths, so
  ``load_from_disk`` of either needs no rule at all.
* **Data from elsewhere** — files read from disk or the Hub (Parquet, JSON, CSV, Arrow files,
  a ``load_from_disk`` folder someone handed over): their path cells were written by
  whoever made the files, so they may lead only inside the folders of the dataset's own
  files (a relative one is relative to their folder, as ``mmbatch caption`` reads a Parquet
  file's), or the folders the caller allows (``allowed_paths``). Anything else is that row's
  error (``mmbatch.sources.paths``).

datasets records what a dataset was built from: its builder (``info.builder_name``) and its
Arrow files (``cache_files``; none for a dataset in memory). A builder's own output sits in
its cache as ``BUILDER-SPLIT*.arrow``; a saved dataset's folder holds ``state.json``, and
whatever its ``dataset_info.json`` claims, it is files from disk. A streaming dataset keeps
its source in its examples iterable: the builder (with the files it listed) or, from
``to_iterable_dataset``, the Arrow shards of the dataset it came from.

What a ``Dataset`` does not record is the files its builder read: the builder is gone once
``load_dataset`` returns. So, from the moment mmbatch's datasets face is imported, each
builder's ``as_dataset`` notes them first, by the folder of the Arrow files it writes
(``remember_data_files``): a dataset loaded after ``from mmbatch import DatasetMap`` (or
``run_dataset``) has its data files' folder. One loaded before has none known: its relative
path cells are relative to the working directory, and an imagefolder's links may lead only
inside the folder each was found in.

``Dataset.map`` does not tell its function which dataset it maps, so ``DatasetMap`` looks the
dataset up in datasets' own map frames (``mapped_dataset``); where it cannot be found, the
rule cannot decide, and the caller says so loudly rather than refusing every row.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmbatch.media.fetch import is_url
from mmbatch.sources.paths import LocalPaths

FOLDER_BUILDERS = frozenset({"imagefolder", "audiofolder", "videofolder"})
"""datasets' builders that list a local folder: their path cells are files they found."""
OWN_BUILDERS = FOLDER_BUILDERS | {"generator"}
"""Builders whose rows the caller's own call made (a folder it named, its own generator)."""

Trust = Literal["own", "listed", "files", "unknown"]


@dataclass(frozen=True)
class DatasetOrigin:
    """What a dataset was built from, as far as datasets recorded it."""

    trust: Trust
    """``own``: the person's own dataset, its paths read anywhere; ``listed``: files a
    folder builder listed, held to a walk's rule; ``files``: data from files, its paths
    read inside ``folders`` only; ``unknown``: not found out."""
    reason: str
    """Said where a path is refused or the rule is reported (``an imagefolder``)."""
    folders: tuple[str, ...] = ()
    """The folders of the dataset's own files (``files`` only)."""
    folder: str | None = None
    """The dataset's own folder, where known: the one its relative path cells are relative
    to, and for ``listed``, the folder the builder listed."""

    def paths(self, allowed: LocalPaths) -> LocalPaths:
        """The path rule for this dataset's cells: ``allowed`` (the caller's folders),
        widened to everywhere for the person's own dataset, to the folder listed (a
        walk's rule) for a folder builder's, or to its own files' folders."""
        if self.trust == "own":
            return LocalPaths(allowed.roots, anywhere=True, widen=allowed.widen)
        if self.trust == "listed":
            return LocalPaths(allowed.roots, allowed.anywhere, allowed.widen, listing=True)
        return LocalPaths(allowed.roots + self.folders, allowed.anywhere, allowed.widen)


UNKNOWN = DatasetOrigin("unknown", "a dataset mmbatch cannot see (only its batches)")


def origin_of(dataset: Any) -> DatasetOrigin:
    """The origin of a ``datasets.Dataset`` or ``IterableDataset``."""
    import datasets

    if isinstance(dataset, datasets.IterableDataset):
        return _streaming_origin(dataset)
    if isinstance(dataset, datasets.Dataset):
        return _table_origin(dataset)
    return UNKNOWN


def _table_origin(dataset: Any) -> DatasetOrigin:
    builder = dataset.info.builder_name
    files = [Path(f["filename"]) for f in dataset.cache_files]
    if not files:
        if builder is None:
            return DatasetOrigin("own", "a dataset built in memory by this process")
        if builder in OWN_BUILDERS:  # load_dataset(..., keep_in_memory=True)
            return _builder_origin(builder, ())
        return DatasetOrigin("files", f"{builder} files held in memory")
    folders = tuple(sorted({str(f.parent) for f in files}))
    in_cache = builder is not None and all(_builders_cache(Path(f), str(builder)) for f in folders)
    if in_cache:
        read = [_LOADED.get(os.path.realpath(f)) for f in folders]
        if builder in OWN_BUILDERS or all(r is not None for r in read):
            return _builder_origin(builder, [f for r in read for f in r or ()])
    saved = any((Path(f) / "state.json").is_file() for f in folders)
    kind = "a saved dataset" if saved else f"{builder or 'Arrow'} files"
    # datasets' cache is no folder of the dataset's own: its relative cells have none known.
    own = folders[0] if len(folders) == 1 and not in_cache else None
    return DatasetOrigin("files", f"{kind} read from {', '.join(folders)}", folders, own)


def _builder_origin(builder: str, data_files: Sequence[str]) -> DatasetOrigin:
    """The origin of what the datasets builder ``builder`` made of the local files
    ``data_files`` (none known: a folder builder's files are held each to its own folder)."""
    if builder == "generator":
        return DatasetOrigin("own", _own_reason(builder))
    folders = tuple(sorted({os.path.dirname(f) for f in data_files}))
    if builder in FOLDER_BUILDERS:
        listed = os.path.commonpath(folders) if folders else None
        return DatasetOrigin("listed", _own_reason(builder), folder=listed)
    own = folders[0] if len(folders) == 1 else None
    where = ", ".join(folders) or "a store or the Hub"
    return DatasetOrigin("files", f"{builder} files read from {where}", folders, own)


_LOADED: dict[str, tuple[str, ...]] = {}
"""The local files each datasets builder of this process read, by the folder of the Arrow
files it wrote them to (``remember_data_files``)."""


def remember_data_files() -> None:
    """Have each datasets builder of this process note the local files it reads as it
    makes a dataset of them (``DatasetBuilder.as_dataset``, which ``load_dataset`` calls),
    since the dataset it returns does not record them. Once per process."""
    from datasets.builder import DatasetBuilder

    made: Callable[..., Any] = DatasetBuilder.as_dataset
    if getattr(made, "_notes_data_files", False):
        return

    @functools.wraps(made)
    def as_dataset(builder: Any, *args: Any, **kwargs: Any) -> Any:
        # Where it writes its Arrow files: its cache, unless prepared into another folder.
        for name in ("cache_dir", "_output_dir"):
            folder = getattr(builder, name, None)
            if isinstance(folder, str) and not is_url(folder):
                _LOADED[os.path.realpath(folder)] = data_files_of(builder)
        return made(builder, *args, **kwargs)

    as_dataset._notes_data_files = True  # type: ignore[attr-defined]
    setattr(DatasetBuilder, "as_dataset", as_dataset)  # noqa: B010 (a method, replaced)


def data_files_of(builder: Any) -> tuple[str, ...]:
    """The local files (not URLs) a datasets builder reads, every split's."""
    files = getattr(getattr(builder, "config", None), "data_files", None)
    if not isinstance(files, dict):
        return ()
    named = {str(f) for split in files.values() for f in split}
    return tuple(sorted(os.path.abspath(f) for f in named if not is_url(f)))


def _builders_cache(folder: Path, builder: str) -> bool:
    """Whether ``folder`` is where ``builder`` wrote its output in datasets' cache (its
    ``BUILDER-SPLIT*.arrow`` files, beside which ``map`` writes its ``cache-*.arrow``),
    rather than a saved dataset's folder (``state.json``), whatever its info claims."""
    if (folder / "state.json").is_file():
        return False
    return any(folder.glob(f"{builder}-*.arrow"))


def _streaming_origin(dataset: Any) -> DatasetOrigin:
    sources = list(sources_of(dataset._ex_iterable))
    if not sources:
        return UNKNOWN
    origins = [_source_origin(source) for source in sources]
    if all(o == origins[0] for o in origins) or all(o.trust == "own" for o in origins):
        return origins[0]
    if any(o.trust == "unknown" for o in origins):
        return UNKNOWN
    # Sources of several kinds: each one's folders, and no folder of the whole.
    others = [o for o in origins if o.trust != "own"]
    folders = {f for o in others for f in (*o.folders, *([o.folder] if o.folder else []))}
    return DatasetOrigin("files", others[0].reason, tuple(sorted(folders)))


def _source_origin(source: Any) -> DatasetOrigin:
    import datasets

    if isinstance(source, datasets.Dataset):
        return _table_origin(source)
    name = getattr(getattr(source, "info", None), "builder_name", None)
    data_files = data_files_of(source)
    if name in OWN_BUILDERS or data_files:
        return _builder_origin(str(name), data_files)
    return DatasetOrigin("files", f"{name or 'unknown'} files, streamed")


def sources_of(iterable: Any) -> Iterator[Any]:
    """The objects at the bottom of a chain of datasets' examples iterables: the builders
    whose generators they call, or the ``Dataset`` shards they read."""
    inner = [getattr(iterable, "ex_iterable", None), *getattr(iterable, "ex_iterables", ())]
    inner = [each for each in inner if each is not None]
    if inner:
        for each in inner:
            yield from sources_of(each)
        return
    kwargs = getattr(iterable, "kwargs", None) or {}
    shards = kwargs.get("shards") if isinstance(kwargs, dict) else None
    if shards:
        yield from shards
        return
    for name in ("generate_examples_fn", "generate_tables_fn"):
        owner = getattr(getattr(iterable, name, None), "__self__", None)
        if owner is not None:
            yield owner
            return


def _own_reason(builder: str) -> str:
    if builder == "generator":
        return "a dataset built by this process's own generator"
    return f"an {builder} that datasets listed from a local folder"


def mapped_dataset() -> Any | None:
    """The dataset whose ``map`` is calling the caller, found in datasets' own frames
    (``Dataset._map_single``'s shard, an ``IterableDataset`` being iterated); None where
    there is none (a call from elsewhere, or a datasets that keeps it elsewhere)."""
    import datasets

    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module in ("datasets.arrow_dataset", "datasets.iterable_dataset"):
            for name in ("shard", "self"):
                value = frame.f_locals.get(name)
                if isinstance(value, (datasets.Dataset, datasets.IterableDataset)):
                    return value
        frame = frame.f_back
    return None


def folder_of(path: str) -> str:
    """The folder to allow so that ``path`` is read: the one-argument fix a refusal names."""
    return os.path.dirname(os.path.abspath(path))
