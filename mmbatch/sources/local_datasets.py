"""Read a local Hugging Face dataset as ``Request``s: what ``mmbatch caption`` does with a
``save_to_disk`` folder, Parquet files, an ``imagefolder`` (with a metadata file) or
WebDataset tars.

The image column is read from the Arrow data as it is stored, undecoded and uncopied: each
row's bytes are a view into the memory-mapped file, hashed as they are and decoded once by
the loader, like a file's. Every format is read through datasets' Arrow files, which are
memory-mapped, so a dataset larger than memory is paged in as the job reads it. Row ids are
the row's index in the split (or the ``id_column``'s value), which is what output rows,
resume and the review gallery know an item by. A cell that holds a path rather than bytes is
relative to the dataset's folder and must lead inside it, or into a folder the person running
the job allowed (``mmbatch.sources.paths``); one that does not is its row's error.

A dataset may be kept in storage (``s3://bucket/data/`` holding Parquet files or WebDataset
shards, a ``save_to_disk`` folder, an imagefolder): datasets reads it through fsspec, the
storage's own file system finding its credentials, and caches what it downloads as it caches
the Hub's datasets. Its path cells are relative to the dataset's prefix, under the path rule
for URLs.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mmbatch.errors import ItemFailure, SourceError, StorageError, StorageUnavailable
from mmbatch.sources.cells import ROWS_PER_READ, column_cells, media_ref
from mmbatch.sources.files import IMAGE_SUFFIXES, KeepColumns, input_columns
from mmbatch.sources.paths import LocalPaths
from mmbatch.storage.located import StoredPlace, locate
from mmbatch.storage.objects import list_objects, redacted
from mmbatch.storage.urls import name as object_name
from mmbatch.storage.urls import unsupported_folder
from mmbatch.types import ItemError, MediaRef, Request

if TYPE_CHECKING:
    import datasets

DatasetFormat = Literal["disk", "parquet", "imagefolder", "webdataset"]
IMAGE_FOLDER_METADATA = ("metadata.jsonl", "metadata.csv", "metadata.parquet")


@dataclass(frozen=True)
class DatasetInput:
    """Which local dataset to read and how: everything needed to open it again later (the
    review gallery does, to show each row's picture)."""

    path: str
    format: DatasetFormat
    image_column: str | None = None
    split: str | None = None
    id_column: str | None = None

    def __post_init__(self) -> None:
        # datasets hands any URL to fsspec: only a store's is read (a web URL is fetched by
        # mmbatch alone, with --allow-urls), any other is refused before fsspec is asked.
        refusal = unsupported_folder(self.path)
        if refusal is not None:
            raise SourceError(f"the dataset {refusal}")


def detect_format(path: str) -> DatasetFormat | None:
    """The dataset format ``path`` is stored in, or None for plain media files."""
    place = locate(path)
    if isinstance(place, StoredPlace):
        return _detect_in_storage(place)
    root = Path(path)
    if root.is_file():
        suffix = root.suffix.lower()
        return "parquet" if suffix == ".parquet" else "webdataset" if suffix == ".tar" else None
    if not root.is_dir():
        return None
    if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
        return "disk"
    if any((root / name).is_file() for name in IMAGE_FOLDER_METADATA):
        return "imagefolder"
    suffixes = {p.suffix.lower() for p in root.rglob("*") if p.is_file()}
    if suffixes & IMAGE_SUFFIXES:
        return None  # a folder of pictures: read by path, unless --input-format says otherwise
    if ".parquet" in suffixes:
        return "parquet"
    if ".tar" in suffixes:
        return "webdataset"
    return None


def _detect_in_storage(place: StoredPlace) -> DatasetFormat | None:
    """``detect_format`` for a URL: by an object's suffix, or by what a prefix holds."""
    url = place.url
    if glob.has_magic(url):
        return None
    if place.kind() != "folder":
        suffix = Path(url).suffix.lower()
        return "parquet" if suffix == ".parquet" else "webdataset" if suffix == ".tar" else None
    found = list_objects(url)
    names = {object_name(u) for u in found}
    if names & {"state.json", "dataset_dict.json"}:
        return "disk"
    if names & set(IMAGE_FOLDER_METADATA):
        return "imagefolder"
    suffixes = {Path(n).suffix.lower() for n in names}
    if suffixes & IMAGE_SUFFIXES:
        return None
    return "parquet" if ".parquet" in suffixes else "webdataset" if ".tar" in suffixes else None


def open_dataset(spec: DatasetInput) -> tuple[datasets.Dataset, str]:
    """The split ``spec`` names, and its image column."""
    import datasets

    loaded = _load(spec)
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[_pick_split(spec, list(loaded))]
    elif spec.split is not None:
        raise SourceError(f"{spec.path} holds a single split, not {spec.split!r}: drop --split")
    column = spec.image_column or _pick_image_column(spec.path, loaded.features)
    if column not in loaded.column_names:
        raise SourceError(
            f"{spec.path}: no column {column!r}; columns: {', '.join(loaded.column_names)}"
        )
    if spec.id_column is not None and spec.id_column not in loaded.column_names:
        raise SourceError(f"{spec.path}: no id column {spec.id_column!r}")
    return loaded, column


def dataset_requests(
    spec: DatasetInput,
    prompt: str,
    system: str | None = None,
    keep: KeepColumns = "all",
    paths: LocalPaths | None = None,
) -> list[Request]:
    """One request per row; a row without usable media (an empty cell, a cell of the wrong
    type, a path that leads outside the dataset's folder and the ``paths`` allowed) carries
    its error, so that every row still ends as one output row. The row's
    other columns that ``keep`` names (``"all"``: every one that is not media or bytes, as
    ``Dataset.map`` keeps them) go into its output row."""
    dataset, column = open_dataset(spec)
    kept = _kept_columns(spec, dataset, column, keep)
    requests: list[Request] = []
    seen: set[str] = set()
    listed = _rows(spec, dataset, column, paths or LocalPaths())
    rows = zip(listed, _column_values(dataset, kept), strict=True)
    for index, ((row_id, ref), values) in enumerate(rows):
        if row_id in seen:
            raise SourceError(f"{spec.path}: duplicate id {row_id!r} in {spec.id_column!r}")
        seen.add(row_id)
        columns = input_columns(values, kept)
        if isinstance(ref, MediaRef):
            requests.append(Request(row_id, prompt, (ref,), system, columns=columns))
        else:
            named = (MediaRef("image", f"{spec.path}#{index}"),)
            error = ItemError(ref.stage, str(ref), ref.kind)
            requests.append(Request(row_id, prompt, named, system, columns=columns, error=error))
    if not requests:
        raise SourceError(f"{spec.path}: the dataset has no rows")
    return requests


def _kept_columns(
    spec: DatasetInput, dataset: datasets.Dataset, column: str, keep: KeepColumns
) -> tuple[str, ...]:
    import datasets

    def binary(feature: Any) -> bool:
        media = (datasets.Image, datasets.Audio, datasets.Video)
        return isinstance(feature, media) or getattr(feature, "dtype", None) in (
            "binary",
            "large_binary",
        )

    features = dataset.features
    if keep == "all":
        skip = {column, spec.id_column}
        return tuple(n for n, f in features.items() if n not in skip and not binary(f))
    for name in keep:
        if name not in features:
            raise SourceError(
                f"{spec.path}: no column {name!r} to keep; columns: {', '.join(features)}"
            )
        if binary(features[name]):
            raise SourceError(
                f"{spec.path}: the column {name!r} holds media or bytes, "
                "which an output row cannot carry"
            )
    return tuple(keep)


def _column_values(dataset: datasets.Dataset, names: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Each row's values of ``names`` (empty dicts when none are kept)."""
    if not names:
        for _ in range(dataset.num_rows):
            yield {}
        return
    for table in dataset.select_columns(list(names)).with_format("arrow").iter(ROWS_PER_READ):
        yield from table.to_pylist()


def media_by_id(spec: DatasetInput) -> dict[str, MediaRef]:
    """Each row's media, by row id (for the gallery's thumbnails; a path outside the
    dataset's folder is left out)."""
    dataset, column = open_dataset(spec)
    rows = _rows(spec, dataset, column, LocalPaths())
    return {row_id: ref for row_id, ref in rows if isinstance(ref, MediaRef)}


def _rows(
    spec: DatasetInput, dataset: datasets.Dataset, column: str, paths: LocalPaths
) -> list[tuple[str, MediaRef | ItemFailure]]:
    ids = dataset[spec.id_column] if spec.id_column else None
    folder = _folder(spec.path)
    rows: list[tuple[str, MediaRef | ItemFailure]] = []
    for index, cell in enumerate(column_cells(dataset, column)):
        row_id = str(ids[index]) if ids is not None else str(index)
        try:
            label = f"{spec.path}#{index}"
            rows.append((row_id, media_ref(cell, "image", label, paths, folder)))
        except ItemFailure as exc:
            rows.append((row_id, exc))
    return rows


def _folder(path: str) -> str:
    """The dataset's own folder (or prefix): ``path``, or the one holding a file named."""
    return locate(path).own_folder.text


def _files(path: str, pattern: str) -> list[str]:
    """The dataset's files: the one named, or every one under its folder matching
    ``pattern``, sorted."""
    return locate(path).files(pattern)


def _load(spec: DatasetInput) -> Any:
    import datasets

    path = spec.path
    try:
        if spec.format == "disk":
            return datasets.load_from_disk(path)
        if spec.format == "imagefolder":
            return datasets.load_dataset("imagefolder", data_dir=path)
        pattern = {"parquet": "*.parquet", "webdataset": "*.tar"}[spec.format]
        files = _files(path, pattern)
        if not files:
            raise SourceError(f"{path}: no {pattern} files for the {spec.format} format")
        if spec.format == "webdataset":
            for shard in files:
                _check_shard(shard)
        return datasets.load_dataset(spec.format, data_files={"train": files})
    except (SourceError, StorageError, StorageUnavailable):
        raise
    except Exception as exc:
        # datasets decodes every member of a shard while it reads it (JSON, numbers, NumPy
        # arrays...): whatever one of its decoders raises means the dataset cannot be read.
        raise SourceError(
            f"cannot read {path} as a {spec.format} dataset: {type(exc).__name__}: "
            + redacted((str(exc).splitlines() or [""])[0])
        ) from exc


UNSAFE_MEMBERS = frozenset({"pth"})
"""WebDataset member types that datasets decodes by unpickling (``torch.load``): a shard
holding one is refused before datasets reads it, since unpickling runs code."""


def _check_shard(shard: str) -> None:
    """Refuse a WebDataset shard with a member datasets would unpickle (by its headers only:
    no member is read)."""
    import tarfile

    try:
        # A shard in storage is streamed (``r|``: headers read in order, members passed over).
        place = locate(shard)
        with (
            tarfile.open(fileobj=place.open(), mode="r|")
            if isinstance(place, StoredPlace)
            else tarfile.open(shard)
        ) as archive:
            for member in archive:
                kind = member.name.rsplit(".", 1)[-1].lower()
                if member.isfile() and kind in UNSAFE_MEMBERS:
                    raise SourceError(
                        f"{shard} holds {member.name!r}, a .{kind} member that reading the shard "
                        "would unpickle (torch.load); remove such members from the shard"
                    )
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"cannot read {shard} as a tar archive: {exc}") from None


def _pick_split(spec: DatasetInput, splits: list[str]) -> str:
    if spec.split is not None:
        if spec.split not in splits:
            raise SourceError(f"{spec.path}: no split {spec.split!r}; splits: {', '.join(splits)}")
        return spec.split
    if len(splits) == 1:
        return splits[0]
    if "train" in splits:
        return "train"
    raise SourceError(f"{spec.path} has splits {', '.join(splits)}: pick one with --split")


def _pick_image_column(path: str, features: datasets.Features) -> str:
    import datasets

    images = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    if len(images) == 1:
        return str(images[0])
    raise SourceError(
        f"{path}: "
        + (f"several image columns ({', '.join(images)})" if images else "no image column")
        + f"; name one with --image-column (columns: {', '.join(features)})"
    )


@dataclass(frozen=True)
class ParquetLayout:
    """A dataset of Parquet files as a Ray job reads it: the files, each with the index of
    its first row, its image column and its ids, learnt from the files' footers and the id
    column alone (no picture is read here: Ray's tasks read them)."""

    files: tuple[tuple[str, int], ...]
    image_column: str
    id_column: str | None
    ids: tuple[str, ...]

    def requests(self, spec: DatasetInput, prompt: str, system: str | None) -> list[Request]:
        """One request per row, named as a local run names it (``PATH#INDEX``)."""
        return [
            Request(row_id, prompt, (MediaRef("image", f"{spec.path}#{index}"),), system)
            for index, row_id in enumerate(self.ids)
        ]


def parquet_layout(spec: DatasetInput) -> ParquetLayout:
    """``ParquetLayout`` of the Parquet dataset ``spec`` (local, or kept in storage)."""
    import datasets
    import pyarrow.parquet as pq

    files = _files(spec.path, "*.parquet")
    if not files:
        raise SourceError(f"{spec.path}: no *.parquet files for the parquet format")
    layout: list[tuple[str, int]] = []
    ids: list[str] = []
    column = spec.image_column
    for file in files:
        try:
            parquet = pq.ParquetFile(_opened(file))
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot read {file} as Parquet: {redacted(str(exc))}") from None
        with parquet:
            if column is None:
                features = datasets.Features.from_arrow_schema(parquet.schema_arrow)
                column = _pick_image_column(spec.path, features)
            layout.append((file, len(ids)))
            count = parquet.metadata.num_rows
            if spec.id_column is None:
                ids += [str(i) for i in range(len(ids), len(ids) + count)]
            else:
                ids += [str(v) for v in parquet.read(columns=[spec.id_column])[0].to_pylist()]
    if len(set(ids)) != len(ids):
        raise SourceError(f"{spec.path}: duplicate ids in {spec.id_column or 'the rows'!r}")
    assert column is not None
    return ParquetLayout(tuple(layout), column, spec.id_column, tuple(ids))


def _opened(file: str) -> Any:
    """``file`` opened for reading, in storage (through its file system) or local."""
    place = locate(file)
    if isinstance(place, StoredPlace):
        from mmbatch.storage.objects import file_system

        fs, path = file_system(place.url)
        return fs.open(path, "rb")
    return place.open()
