"""The three file formats of an output, and the two ways through them: rows in (``open_sink``)
and rows back (``read_output``).

``--out`` picks the format: ``x.parquet`` a Parquet file, ``--out-format datasets`` a
datasets folder (``save_to_disk``), anything else JSON lines, one row per line; a folder of
Parquet shards (``--shard-rows N``) or WebDataset tar shards is ``mmbatch.output.shards``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmbatch.errors import ConfigError, SourceError
from mmbatch.jsonl import JsonlError, read_objects
from mmbatch.output.order import RowOrder
from mmbatch.output.paths import FILE_FORMATS, FileFormat
from mmbatch.output.sinks import JsonlSink, Sink

OTHER_FORMATS = {
    ".csv": "CSV",
    ".tsv": "TSV",
    ".json": "a JSON document",
    ".xlsx": "a spreadsheet",
    ".arrow": "an Arrow file",
    ".feather": "a Feather file",
}
"""Names that promise a format mmbatch does not write: JSON lines there would be read as
that format and fail (or, as CSV, be taken for one column of text)."""


def output_format(out: str | Path, requested: str | None = None) -> FileFormat:
    """The format ``requested``, else the one ``out``'s name implies; a name that implies
    one mmbatch does not write (``x.csv``) is a ``ConfigError``, unless a format is asked
    for."""
    if requested is not None:
        if requested not in FILE_FORMATS:
            raise ConfigError(f"unknown output format {requested!r}; expected {FILE_FORMATS}")
        return requested
    path = Path(out)
    suffix = path.suffix.lower()
    if suffix in OTHER_FORMATS:
        stem = path.with_suffix("").name
        raise ConfigError(
            f"--out {out}: mmbatch does not write {OTHER_FORMATS[suffix]}; name the output "
            f"{stem}.jsonl (JSON lines) or {stem}.parquet, or pass --out-format jsonl to "
            "write JSON lines under this name"
        )
    return "parquet" if suffix == ".parquet" else "jsonl"


def open_sink(
    out: str | Path,
    format: FileFormat,
    append: bool = False,
    order: RowOrder | None = None,
    shard_rows: int | None = None,
) -> Sink:
    """A sink writing ``format`` to ``out``; ``append`` continues a stopped job's rows,
    ``order`` is the order they are left in when it closes, and ``shard_rows`` makes ``out``
    a folder of shards of that many rows (Parquet; WebDataset always has shards)."""
    check_shards(format, shard_rows)
    if format == "webdataset" or shard_rows is not None:
        from mmbatch.output.shards import DEFAULT_SHARD_ROWS, ShardSink

        assert format == "parquet" or format == "webdataset"
        rows = shard_rows or DEFAULT_SHARD_ROWS
        return ShardSink(out, format, rows, append=append, order=order)
    if format == "jsonl":
        return JsonlSink(out, append=append, order=order)
    from mmbatch.output.tables import TableSink

    return TableSink(out, format, append=append, order=order)


def check_shards(format: FileFormat, shard_rows: int | None) -> None:
    """``ConfigError`` for shards of a format that has none, or of no rows."""
    if shard_rows is None:
        return
    if format not in ("parquet", "webdataset"):
        raise ConfigError(f"--shard-rows applies to parquet and webdataset outputs, not {format}")
    if shard_rows < 1:
        raise ConfigError(f"--shard-rows {shard_rows}: must be an integer >= 1")


def read_output(out: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a finished output, whichever format it was written in."""
    path = Path(out)
    if not path.exists():
        raise SourceError(f"no output at {out}")
    from mmbatch.output.shards import is_shard_folder, read_shard_rows

    shards = is_shard_folder(path)
    if shards is not None:
        yield from read_shard_rows(path, shards)
        return
    if path.is_dir() or path.suffix.lower() == ".parquet":
        from mmbatch.output.tables import read_table_rows

        yield from read_table_rows(path)
        return
    try:
        for _, row in read_objects(path):
            yield row
    except JsonlError as exc:
        raise SourceError(str(exc)) from None
