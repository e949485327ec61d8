"""Outputs that are folders of row files, as Ray's writers leave them (JSON lines or Parquet).

Resume and the final one-row-per-item check read such a folder back. Ray's file writers are
not atomic: a job killed mid-write can leave a truncated file, which would make every later
reader of the folder fail. Such a file is renamed with a leading dot (``.partial-NAME``),
which Ray and pyarrow skip when they list a folder, and its rows count as not written, so
the next run produces them again.

Only pyarrow is needed here (no ray), so this is tested without a cluster.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmbatch.errors import ConfigError
from mmbatch.jsonl import JsonlError, read_objects, write_atomic
from mmbatch.output.paths import FileFormat
from mmbatch.output.rows import RowShape

FolderFormat = Literal["jsonl", "parquet"]
"""The writers of a row folder: ``Dataset.write_json`` (one JSON object per line, in
``.json`` files) and ``Dataset.write_parquet``; named as ``--out-format`` names them."""

FOLDER_FORMATS: tuple[FolderFormat, ...] = ("jsonl", "parquet")
SUFFIXES: dict[FolderFormat, str] = {"jsonl": ".json", "parquet": ".parquet"}
PARTIAL_PREFIX = ".partial-"


def folder_format(fmt: FileFormat) -> FolderFormat:
    """``fmt`` if a row folder can be written in it (``ConfigError`` otherwise)."""
    if fmt == "jsonl" or fmt == "parquet":
        return fmt
    raise ConfigError(f"a folder of row files is one of {FOLDER_FORMATS}, not {fmt!r}")


class ForeignFile(ValueError):
    """A file in the output folder that is not one of the job's row files."""


def row_files(folder: Path, fmt: FolderFormat) -> list[Path]:
    """The row files of ``folder`` (``ForeignFile`` for anything else there)."""
    if not folder.exists():
        return []
    files = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "_")) or not path.is_file():
            continue
        if path.suffix != SUFFIXES[fmt]:
            raise ForeignFile(
                f"{path} is not a {SUFFIXES[fmt]} file; the output folder must hold only this "
                f"job's {fmt} rows (use a new folder, or the format it was written in)"
            )
        files.append(path)
    return files


def read_folder(
    folder: Path, fmt: FolderFormat, shape: RowShape, set_aside: bool = True
) -> Iterator[dict[str, Any]]:
    """The rows of every complete row file under ``folder``; a file that cannot be read
    whole is set aside first (its rows are then not written, and get made again), or with
    ``set_aside=False`` (a writer may still be writing it) only passed over."""
    for path in row_files(folder, fmt):
        try:
            rows = _read_file(path, fmt, shape)
        except (ValueError, OSError) as exc:
            if not set_aside:
                continue
            aside = path.with_name(PARTIAL_PREFIX + path.name)
            path.rename(aside)
            print(f"mmbatch: set aside the unreadable output file {path} ({exc})", file=sys.stderr)
            continue
        yield from rows


def drop_rows(folder: Path, fmt: FolderFormat, shape: RowShape, ids: set[str]) -> None:
    """Rewrite each row file of ``folder`` without the rows of ``ids`` (to be redone)."""
    for path in row_files(folder, fmt):
        rows = _read_file(path, fmt, shape)
        kept = [r for r in rows if shape.row_id(r) not in ids]
        if len(kept) == len(rows):
            continue
        if fmt == "jsonl":
            write_atomic(path, kept)
        else:
            _write_parquet_atomic(path, kept)


@dataclass(frozen=True)
class FolderRows:
    """A row folder as resume reads it (``mmbatch.output.resume.WrittenRows``): a file cut
    short is set aside as it is read, so there is nothing left to repair after."""

    path: Path
    format: FolderFormat

    def has_rows(self) -> bool:
        return bool(self._files())

    def check_is_output(self, shape: RowShape, record: Path) -> None:
        self._files()  # a file that is not a row file is refused before anything changes

    def whole_rows(self, shape: RowShape) -> Iterator[dict[str, Any]]:
        self._files()
        return read_folder(self.path, self.format, shape)

    def repair(self) -> int:
        return 0

    def drop(self, shape: RowShape, ids: set[str]) -> None:
        drop_rows(self.path, self.format, shape, ids)

    def _files(self) -> list[Path]:
        try:
            return row_files(self.path, self.format)
        except ForeignFile as exc:
            raise ConfigError(str(exc)) from None


def _read_file(path: Path, fmt: FolderFormat, shape: RowShape) -> list[dict[str, Any]]:
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        except pa.ArrowException as exc:
            raise ValueError(str(exc)) from exc
    else:
        try:
            rows = [row for _, row in read_objects(path)]
        except JsonlError as exc:  # a torn or foreign line: the caller sets the file aside
            raise ValueError(str(exc)) from None
    for row in rows:
        try:
            shape.row_id(row)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: a row that is not an output row ({exc})") from None
    return rows


def _write_parquet_atomic(path: Path, rows: list[dict[str, Any]]) -> None:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), temporary)
    os.replace(temporary, path)
