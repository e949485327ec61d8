"""Turn one cell of a Hugging Face datasets media column into a ``MediaRef``.

datasets stores media as ``{"bytes": ..., "path": ...}`` and decodes only when read, which
is what mmbatch wants: with ``Image(decode=False)`` / ``Audio(decode=False)`` the cell's raw
bytes are hashed as they are, exactly like a file's. A decoded ``Image()`` column hands over
PIL images instead, which the loader hashes by mode, size and pixels. A cell that is none of
these raises ``ItemFailure`` naming the row, so the caller can make it an error row; so does
a path cell that leads outside where the dataset may point (``mmbatch.sources.paths``).
"""

from __future__ import annotations

from typing import Any

from mmbatch.errors import ItemFailure
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import MediaRef, Modality


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
