"""A Ray job's rows as Arrow tables, what its tasks and replicas exchange: the input row of
a request (its id, its picture's path or URL, its prompt and system prompt, the picture
itself where the row holds it), the key of the picture it shares with other rows, a group of
rows sharing one picture packed into one row and unpacked into requests again, and the
flat output row's types. Plain pyarrow, run inside Ray's tasks and actors
(``ray_data``); nothing here imports ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from mmbatch.errors import ConfigError
from mmbatch.media.options import ImageOptions
from mmbatch.output.rows import output_row
from mmbatch.types import ItemError, MediaRef, Request, Result

if TYPE_CHECKING:
    import pyarrow as pa

INPUT_COLUMNS = ("id", "path", "prompt", "system")
"""Columns of an input row; ``id`` and ``path`` are required, ``prompt`` falls back to the
job's prompt, ``system`` to the model's default."""


class InputRow(TypedDict):
    """An input row the driver builds from a request (``INPUT_COLUMNS``)."""

    id: str
    path: str
    prompt: str
    system: str | None


DATA_COLUMN = "data"
"""An input row's picture, held in the row (a dataset's bytes, ``ray_data.parquet_rows``):
``path`` then only names it."""

GROUP_COLUMN = "media_group"
"""The content key of a row's picture (``add_media_group``), by which the rows that share
one are grouped, so that one replica takes them together and its caches hit."""


def input_row(request: Request) -> InputRow:
    """The input row of a request with one picture: its id, the picture's path or URL, its
    prompt and system prompt."""
    if len(request.media) != 1:
        raise ConfigError(
            f"the Ray runner takes requests with exactly one picture; {request.id!r} has "
            f"{len(request.media)}"
        )
    return {
        "id": request.id,
        "path": request.media[0].source,
        "prompt": request.prompt,
        "system": request.system,
    }


def flat_schema() -> pa.Schema:
    """The Arrow types of a flat row for a one-picture request, read off ``output_row``
    itself (a row that succeeded and one that failed), so that every batch and every file
    agree, whatever their rows hold."""
    import pyarrow as pa

    request = Request("id", "prompt", (MediaRef("image", "source"),))
    ok = output_row(request, ("key",), Result("id", "text", "stop"))
    failed = output_row(request, ("key",), Result.failure("id", "load", "message", "unreadable"))
    return pa.Table.from_pylist([ok, failed]).schema


def drop_ids(batch: pa.Table, skip: list[str]) -> pa.Table:
    """``batch`` without the rows whose id is in ``skip`` (those a resumed job has)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pc.cast(batch["id"], pa.string())
    return batch.filter(pc.invert(pc.is_in(ids, value_set=pa.array(skip, pa.string()))))


def add_media_group(batch: pa.Table, options: ImageOptions) -> pa.Table:
    """Add each row's placement key: the content key of its file, as the loader computes it.

    A file that cannot be read gets a key naming its path; the actor's loader then turns
    it into the error row, exactly as on the local path.
    """
    from mmbatch.errors import MediaError
    from mmbatch.media.fetch import read_source
    from mmbatch.media.hashing import media_key

    token = options.cache_token()
    keys: dict[str, str] = {}
    groups = []
    held = held_data(batch)
    for path, data in zip(batch["path"].to_pylist(), held, strict=True):
        source = str(path)
        if data is not None:
            groups.append(media_key("image", data, token))
            continue
        if source not in keys:
            try:  # regular files only, bounded: a FIFO must not hang the task
                keys[source] = media_key("image", read_source(source, None), token)
            except MediaError:
                keys[source] = f"unreadable:{source}"
        groups.append(keys[source])
    return batch.append_column(GROUP_COLUMN, strings(groups))


def pack_group(group: pa.Table) -> pa.Table:
    """One row for all the requests that share a picture, as list columns (the shuffle
    does not keep input order; the planner orders them in the actor)."""
    import pyarrow as pa

    packed: dict[str, Any] = {GROUP_COLUMN: [group[GROUP_COLUMN][0].as_py()]}
    for name in INPUT_COLUMNS:
        packed[name] = [text_column(group, name)]
    if DATA_COLUMN in group.column_names:
        packed[DATA_COLUMN] = pa.array([held_data(group)], pa.list_(pa.large_binary()))
    return pa.table(packed)


def unpack_groups(batch: pa.Table, default_prompt: str | None) -> list[Request]:
    """The requests of a batch of packed groups (``pack_group``), in a replica."""
    requests = []
    columns = {name: batch[name].to_pylist() for name in INPUT_COLUMNS}
    held = batch[DATA_COLUMN].to_pylist() if DATA_COLUMN in batch.column_names else None
    for g in range(batch.num_rows):
        rows = zip(*(columns[name][g] for name in INPUT_COLUMNS), strict=True)
        data = held[g] if held is not None else [None] * len(columns["id"][g])
        requests += [
            input_request(*row, default_prompt=default_prompt, data=bytes_)
            for row, bytes_ in zip(rows, data, strict=True)
        ]
    return requests


def input_request(
    item_id: str,
    path: str | None,
    prompt: str | None,
    system: str | None,
    *,
    default_prompt: str | None,
    data: bytes | None = None,
) -> Request:
    """The request of one input row, the same on the driver (``ray_data``) and in the
    actor that runs it (which has the picture's ``data`` when the row holds it)."""
    text = prompt if prompt is not None else default_prompt or ""
    return Request(
        id=item_id,
        prompt=text,
        media=(MediaRef("image", path or "", data=data),),
        system=system,
        error=None if text else ItemError("source", "the row has no prompt"),
    )


def text_column(batch: pa.Table, name: str) -> list[str | None]:
    """An input column as text (None where it is missing), as the replicas read it."""
    if name not in batch.column_names:
        return [None] * batch.num_rows
    return [None if v is None else str(v) for v in batch[name].to_pylist()]


def held_data(batch: pa.Table) -> list[bytes | None]:
    """The pictures the rows hold (None for each row that names a file)."""
    if DATA_COLUMN not in batch.column_names:
        return [None] * batch.num_rows
    return list(batch[DATA_COLUMN].to_pylist())


def read_parquet_rows(
    batch: dict[str, Any], image: str, id_column: str | None, prompt: str, system: str | None
) -> pa.Table:
    """The input rows of one Parquet file (``batch``: its path or URL and the index of its
    first row in the dataset), in a Ray task: each row's picture held in ``DATA_COLUMN``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mmbatch.storage.located import locate

    file, offset = str(batch["file"][0]), int(batch["offset"][0])
    columns = [image] + ([id_column] if id_column else [])
    filesystem, where = locate(file).arrow()
    table = pq.read_table(where, columns=columns, filesystem=filesystem)
    cells = table[image].to_pylist()
    ids = table[id_column].to_pylist() if id_column else range(offset, offset + len(cells))
    rows: dict[str, list[Any]] = {"id": [], "path": [], "prompt": [], "system": [], DATA_COLUMN: []}
    for index, (row_id, cell) in enumerate(zip(ids, cells, strict=True), start=offset):
        cell = cell if isinstance(cell, dict) else {"bytes": cell}
        named = cell.get("path")
        rows["id"].append(str(row_id))
        rows["path"].append(f"{file}#{index}" + (f" ({named})" if named else ""))
        rows["prompt"].append(prompt)
        rows["system"].append(system)
        rows[DATA_COLUMN].append(cell.get("bytes"))
    types = {DATA_COLUMN: pa.large_binary()}
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in rows.items()})


def strings(values: list[str]) -> pa.Array:
    """``values`` as an Arrow column of strings."""
    import pyarrow as pa

    return pa.array(values, pa.string())
