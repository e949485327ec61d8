"""Sharded outputs for big jobs: a folder of Parquet files of N rows each, or WebDataset tar
shards holding each item's media and row, as img2dataset writes them.

Like the single-file tables (``mmbatch.output.tables``), rows go first to the JSONL spool
beside the output (``OUT.rows.jsonl``: what resume reads), and the shards are written from
it when the job closes, rows in input order, into a temporary folder that then replaces the
output folder: a reader never sees half a set of shards.

* Parquet: ``part-00000.parquet``, ... with one schema over every row (a column that is
  null in the first shard and text in a later one is text in all of them).
* WebDataset: ``00000.tar``, ...; each item is ``KEY.json`` (its row), ``KEY.txt`` (its
  text, for rows that have one) and ``KEY.jpg`` (or the file's own suffix: its media, the
  saved frame for a frame row), ``KEY`` being the row's place in the output (``000000042``).
  Media held only in memory (a dataset's cells) have no file to copy: their rows are
  written without it.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mmbatch.errors import MediaError, SourceError
from mmbatch.jsonl import encode_line, read_objects
from mmbatch.output.order import RowOrder
from mmbatch.output.tables import SpooledSink, typed
from mmbatch.storage.located import StoredPlace, locate

if TYPE_CHECKING:
    import pyarrow as pa

ShardFormat = Literal["parquet", "webdataset"]
DEFAULT_SHARD_ROWS = 10_000
"""Rows per shard when sharding is asked for without a size (img2dataset's default)."""
PARQUET_SHARD = "part-{:05d}.parquet"
TAR_SHARD = "{:05d}.tar"


class ShardSink(SpooledSink):
    """Rows to a folder of shards of ``shard_rows`` rows, through the JSONL spool."""

    def __init__(
        self,
        path: str | Path,
        format: ShardFormat,
        shard_rows: int,
        append: bool = False,
        order: RowOrder | None = None,
    ) -> None:
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        self.format: ShardFormat = format
        self.shard_rows = shard_rows
        super().__init__(path, append, order)

    def _write(self, target: Path) -> None:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        if self.format == "parquet":
            _write_parquet_shards(self.spool_path, target, self.shard_rows)
        else:
            _write_tar_shards(self.spool_path, target, self.shard_rows)


def _chunks(spool: Path, size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for _, row in read_objects(spool):
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _write_parquet_shards(spool: Path, folder: Path, size: int) -> None:
    """Two passes over the spool: the schema of every row, then the shards in it (so that
    no more than a shard's rows are held at once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = [pa.Table.from_pylist(chunk).schema for chunk in _chunks(spool, size)]
    if not schemas:
        return
    schema: pa.Schema = typed(pa.unify_schemas(schemas, promote_options="permissive"))
    for n, chunk in enumerate(_chunks(spool, size)):
        # Every shard in the one schema: a column a shard's rows lack is null there.
        table = pa.Table.from_pylist(chunk, schema=schema)
        pq.write_table(table, folder / PARQUET_SHARD.format(n))


def _write_tar_shards(spool: Path, folder: Path, size: int) -> None:
    key = 0
    for n, chunk in enumerate(_chunks(spool, size)):
        with tarfile.open(folder / TAR_SHARD.format(n), "w") as tar:
            for row in chunk:
                name = f"{key:09d}"
                key += 1
                media = _media_file(row)
                if media is not None:
                    suffix = media.suffix.lower().lstrip(".") or "bin"
                    tar.add(str(media), arcname=f"{name}.{suffix}", recursive=False)
                text = row.get("text")
                if isinstance(text, str):
                    _add(tar, f"{name}.txt", text.encode("utf-8"))
                _add(tar, f"{name}.json", encode_line(row).rstrip(b"\n"))


def _media_file(row: dict[str, Any]) -> Path | None:
    """The file holding a row's media: its saved frame, else its source file (a local copy
    of an object in storage; one that cannot be read leaves the row without its media)."""
    for field in ("frame_path", "source"):
        value = row.get(field)
        place = locate(value) if isinstance(value, str) else None
        if isinstance(place, StoredPlace):
            try:
                return Path(place.local_file())
            except MediaError:
                return None
        if isinstance(value, str) and value and Path(value).is_file():
            return Path(value)
    return None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def is_shard_folder(path: Path) -> ShardFormat | None:
    """The shards ``path`` holds, or None for a folder of another kind (datasets)."""
    if not path.is_dir() or (path / "state.json").is_file():
        return None
    names = [p.name for p in path.iterdir()]
    if any(n.startswith("part-") and n.endswith(".parquet") for n in names):
        return "parquet"
    if any(n.endswith(".tar") for n in names):
        return "webdataset"
    return None


def read_shard_rows(path: Path, format: ShardFormat) -> Iterator[dict[str, Any]]:
    """The rows of a shard folder, in order."""
    if format == "parquet":
        import pyarrow.parquet as pq

        for shard in sorted(path.glob("part-*.parquet")):
            for batch in pq.ParquetFile(shard).iter_batches():
                yield from batch.to_pylist()
        return
    for shard in sorted(path.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if not member.name.endswith(".json"):
                    continue
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                try:
                    row = json.loads(handle.read())
                except ValueError as exc:
                    raise SourceError(f"{shard}: {member.name} is not JSON ({exc})") from None
                yield row
