"""Turn one cell of a Hugging Face datasets media column into a ``MediaRef``.

datasets stores media as ``{"bytes": ..., "path": ...}`` and decodes only when read, which
is what mmbatch wants: with ``Image(decode=False)`` / ``Audio(decode=False)`` the cell's raw
bytes are hashed as they are, exactly like a file's. A decoded ``Image()`` column hands over
PIL images instead, which the loader hashes by mode, size and pixels. A cell that is none of
these raises ``ItemFailure`` naming the row, so the caller can make it an error row; so does
a path cell that leads outside where the dataset may point (``mmbatch.sources.paths``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mmbatch.errors import ItemFailure
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import MediaRef, Modality

if TYPE_CHECKING:
    import datasets

ROWS_PER_READ = 1024
"""Rows taken from the Arrow data at a time while reading a dataset's media column."""


class BadCell(ItemFailure):
    """A dataset cell that holds no usable media (None, an empty dict, an unknown type)."""

    stage = "source"


def media_ref(
    value: Any, modality: Modality, label: str, paths: LocalPaths, folder: str | None
) -> MediaRef:
    """The ``MediaRef`` for one cell; ``label`` names the row in output rows and errors. A
    path cell is relative to ``folder`` (the dataset's own, None for one from the Hub or
    memory) and must lead where ``paths`` allows (``PathNotAllowed``)."""
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
        if data is not None:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise BadCell(f"{label}: 'bytes' holds {type(data).__name__}, not bytes")
            return MediaRef(modality, _name(label, path), data=_bytes(data))
        if isinstance(path, str) and path:
            return paths.resolve(path, folder, label).ref(modality)
        raise BadCell(f"{label}: the {modality} cell has neither bytes nor a path")
    if isinstance(value, (bytes, bytearray, memoryview)):  # a binary column
        return MediaRef(modality, label, data=_bytes(value))
    if isinstance(value, str) and value:
        return paths.resolve(value, folder, label).ref(modality)
    if value is None:
        raise BadCell(f"{label}: no {modality} (the cell is empty)")
    if modality == "image" and _is_pil_image(value):
        return MediaRef("image", label, image=value)
    raise BadCell(
        f"{label}: cannot use a {type(value).__name__} as {modality}; expected "
        f"{{'bytes', 'path'}} (decode=False), bytes, a path"
        + (" or a PIL image" if modality == "image" else "")
    )


def _bytes(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """Bytes as they come (a memoryview stays a zero-copy view, as unsigned bytes)."""
    if isinstance(data, memoryview):
        return data.cast("B") if data.format != "B" else data
    return bytes(data)


def _name(label: str, path: Any) -> str:
    """Output rows name in-memory media by row, with the original file name when known."""
    return f"{label} ({path})" if isinstance(path, str) and path else label


def _is_pil_image(value: Any) -> bool:
    # Checked by module name so that a dataset of bytes never imports Pillow for this.
    return any(
        cls.__module__.startswith("PIL.") and cls.__name__ == "Image" for cls in type(value).__mro__
    )


def column_cells(dataset: datasets.Dataset, column: str) -> Iterator[Any]:
    """The column's cells, read from the Arrow data without decoding or copying: media
    bytes come as memoryviews into the (memory-mapped) Arrow buffers."""
    import pyarrow as pa

    for table in dataset.select_columns([column]).with_format("arrow").iter(ROWS_PER_READ):
        for chunk in table.column(0).chunks:
            kind = chunk.type
            if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
                children = dict(zip([f.name for f in kind], chunk.flatten(), strict=True))
                data = _binary_views(children["bytes"])
                paths = children["path"].to_pylist() if "path" in children else [None] * len(chunk)
                present = chunk.is_valid().to_pylist()
                for cell_present, cell_data, path in zip(present, data, paths, strict=True):
                    yield {"bytes": cell_data, "path": path} if cell_present else None
            elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
                yield from _binary_views(chunk)
            else:
                yield from chunk.to_pylist()


def _binary_views(array: Any) -> list[memoryview | None]:
    """Each value of a binary Arrow array as a view into its data buffer (Arrow's scalars
    would copy every value)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_null(array.type):  # a column of no bytes at all, typed as nothing
        return [None] * len(array)
    _, offsets_buffer, data_buffer = array.buffers()[:3]
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=width)[
        array.offset : array.offset + len(array) + 1
    ]
    data = memoryview(data_buffer if data_buffer is not None else b"").cast("B")
    present = array.is_valid().to_pylist()
    return [
        data[int(offsets[i]) : int(offsets[i + 1])] if present[i] else None
        for i in range(len(array))
    ]
