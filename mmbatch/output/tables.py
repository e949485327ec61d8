"""Columnar outputs: a Parquet file, or a Hugging Face datasets folder (``save_to_disk``).

Both take rows the way every sink does, one at a time, but a columnar file is written whole.
So rows first go, as they finish, to a JSONL spool beside the target (``OUT.rows.jsonl``,
the same row format as ``mmbatch caption``'s JSONL); on ``close`` the spool becomes the
target, with one schema inferred over every row (a column that is null in the first rows
and text later is still a text column), written to a temporary name and moved into place,
so a reader never sees half a file. If the job dies first, the spool keeps the rows done.
"""

from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mmbatch.errors import OutputError, SourceError
from mmbatch.jsonl import cannot_write, printable_values, read_objects
from mmbatch.output.order import RowOrder
from mmbatch.output.paths import OutputPaths
from mmbatch.output.sinks import JsonlSink
from mmbatch.row_schema import COLUMNS, ColumnType

if TYPE_CHECKING:
    import pyarrow as pa

ROWS_PER_CHUNK = 50_000
"""Rows turned into one Arrow table at a time, bounding the Python objects alive at once."""


TableFormat = Literal["parquet", "datasets"]


class SpooledSink(ABC):
    """Rows to the JSONL spool beside ``path`` as they finish (what resume reads), made into
    the output when the sink closes (``_write``, into a temporary name then moved into place:
    a reader never sees half an output). A write that fails leaves the spool, with every row,
    for the next run."""

    def __init__(
        self, path: str | Path, append: bool = False, order: RowOrder | None = None
    ) -> None:
        self.path = Path(path)
        self.spool_path = OutputPaths(self.path).spool
        # append=True continues the spool of a stopped job (``mmbatch.output.resume`` reads it).
        # The spool's rows are put in the job's order when it closes, before conversion.
        self._spool = JsonlSink(self.spool_path, append=append, order=order)
        self._closed = False

    def write(self, row: dict[str, Any]) -> None:
        self._spool.write(row)

    def flush(self) -> None:
        self._spool.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._spool.close()
        temporary = OutputPaths(self.path).temporary
        try:
            self._write(temporary)
            _replace(temporary, self.path)
        except OSError as exc:
            _remove(temporary)
            raise OutputError(cannot_write(self.path, exc)) from None
        self.spool_path.unlink()

    @abstractmethod
    def _write(self, target: Path) -> None:
        """Write the output, from the spool's rows, at ``target``."""


class TableSink(SpooledSink):
    """Rows to a Parquet file (``"parquet"``) or a datasets folder (``"datasets"``, opened by
    ``datasets.load_from_disk``), through a JSONL spool converted on ``close``."""

    def __init__(
        self,
        path: str | Path,
        format: TableFormat,
        append: bool = False,
        order: RowOrder | None = None,
    ) -> None:
        if format not in _WRITERS:
            raise ValueError(f"unknown table format {format!r}; expected one of {list(_WRITERS)}")
        self.format: TableFormat = format
        super().__init__(path, append, order)

    def _write(self, target: Path) -> None:
        tables = list(_tables(self.spool_path))
        schema = _unified_schema(tables)
        _WRITERS[self.format]([t.cast(schema) for t in tables], schema, target)


def _write_parquet(tables: list[pa.Table], schema: pa.Schema, target: Path) -> None:
    import pyarrow.parquet as pq

    with pq.ParquetWriter(target, schema) as writer:
        for table in tables:
            writer.write_table(table)


def _write_dataset_folder(tables: list[pa.Table], schema: pa.Schema, target: Path) -> None:
    import datasets
    import pyarrow as pa

    shutil.rmtree(target, ignore_errors=True)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    datasets.Dataset(table).save_to_disk(str(target))


_WRITERS: dict[str, Callable[[list[pa.Table], pa.Schema, Path], None]] = {
    "parquet": _write_parquet,
    "datasets": _write_dataset_folder,
}


def _replace(temporary: Path, target: Path) -> None:
    """Move the finished output into place; an older output of the same name goes."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(temporary, target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _tables(spool: Path) -> Iterator[pa.Table]:

    chunk: list[dict[str, Any]] = []
    for _, row in read_objects(spool):
        chunk.append(row)
        if len(chunk) == ROWS_PER_CHUNK:
            yield _table(chunk)
            chunk = []
    if chunk:
        yield _table(chunk)


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as an Arrow table. Arrow strings are UTF-8, so a file name that is not (kept exact
    in the spool) is written with its odd bytes escaped (``mmbatch.jsonl.printable``)."""
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows)
    except UnicodeEncodeError:
        return pa.Table.from_pylist([printable_values(row) for row in rows])


def read_table_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a Parquet file or a datasets folder, a batch of rows at a time."""
    if path.is_dir():
        import datasets

        try:
            dataset = datasets.load_from_disk(str(path))
        except FileNotFoundError as exc:
            raise SourceError(f"{path} is not a datasets folder: {exc}") from None
        for batch in dataset.with_format("arrow").iter(ROWS_PER_CHUNK):
            yield from batch.to_pylist()
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{path} is not a Parquet file ({exc})") from None
    for batch in table.iter_batches(batch_size=ROWS_PER_CHUNK):
        yield from batch.to_pylist()


def _unified_schema(tables: list[pa.Table]) -> pa.Schema:
    import pyarrow as pa

    if not tables:
        return pa.schema([])
    return typed(pa.unify_schemas([t.schema for t in tables], promote_options="permissive"))


def typed(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each of mmbatch's columns (``mmbatch.row_schema.COLUMNS``) that is
    null in every row (no row failed: ``error``; every row failed: ``text``) given the type
    it has when it holds values, also inside a recipe's ``outputs``: Arrow would type it
    ``null``, and two outputs with and without errors could not be read or concatenated as
    one table."""
    import pyarrow as pa

    types: dict[ColumnType, pa.DataType] = {
        "string": pa.string(),
        "integer": pa.int64(),
        "float": pa.float64(),
        "error": pa.struct([(name, pa.string()) for name in ("stage", "kind", "message")]),
    }
    known = {column.name: types[column.type] for column in COLUMNS if column.type in types}

    def field(f: pa.Field) -> pa.Field:
        if pa.types.is_null(f.type) and f.name in known:
            return f.with_type(known[f.name])
        if pa.types.is_struct(f.type):
            return f.with_type(pa.struct([field(child) for child in f.type]))
        return f

    return pa.schema([field(f) for f in schema], metadata=schema.metadata)
