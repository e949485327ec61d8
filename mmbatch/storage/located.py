"""Where a named input's bytes live, decided once: ``locate`` turns the text a person (or an
input) wrote into a located value, a local path (``LocalPlace``) or an object or prefix in
a store (``StoredPlace``), and every later step asks that value, never the text again.

The two answer the same questions, each its own way (datatrove's ``DataFolder`` is the
model: one object hides whether the bytes are on this disk or in a store):

* ``shown``: how a message names it (a URL without any ``user:password@`` part);
* ``parent``: the folder (prefix) holding it, which a path written inside it is relative to;
* ``kind``: a folder, a file (object), or nothing there;
* ``lines`` and ``open``: its bytes, read as the job's own input (a failure is the job's);
* ``files``: the files under a folder matching a pattern (a dataset's shards);
* ``local_file``: a local file holding its bytes (an object is copied once per process);
* ``arrow``: the pyarrow file system and path a reader of Parquet takes;
* ``reachable``: a store this machine cannot read is said at once, not per row;
* ``store``: which store holds it (None: this machine).

Which text is in a store is ``mmbatch.storage.urls.is_storage_url``'s to say; this module
asks it once per named input. A URL of a protocol that is not taken is refused before it is
located (``urls.unsupported``), by the caller that names it.
"""

from __future__ import annotations

import fnmatch
import glob
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, TypeAlias

from mmbatch.jsonl import objects_in, read_objects
from mmbatch.storage.objects import (
    file_system,
    glob_objects,
    kind_of,
    list_objects,
    local_copy,
    read_whole,
)
from mmbatch.storage.urls import is_storage_url, parent, protocol_of, shown, spelled
from mmbatch.storage.urls import name as object_name

PlaceKind = Literal["folder", "file"]


@dataclass(frozen=True)
class LocalPlace:
    """A path on this machine's file system."""

    path: str

    @property
    def text(self) -> str:
        """The path, as it opens the file."""
        return self.path

    @property
    def shown(self) -> str:
        return self.path

    @property
    def parent(self) -> LocalPlace:
        return LocalPlace(str(Path(self.path).parent))

    @property
    def own_folder(self) -> LocalPlace:
        """The place itself if it is a folder, else the folder holding it."""
        return self if Path(self.path).is_dir() else self.parent

    def kind(self) -> PlaceKind | None:
        """A folder, a file (a link leading nowhere too: named, it is read and fails as its
        row), or nothing."""
        path = Path(self.path)
        if path.is_dir():
            return "folder"
        return "file" if path.exists() or path.is_symlink() else None

    def matches(self) -> list[str]:
        """The paths a pattern matches (``**`` at any depth), sorted."""
        return sorted(glob.glob(self.path, recursive=True))

    def lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Its JSON lines, read as it streams."""
        return read_objects(self.path)

    def open(self) -> BinaryIO:
        """Its bytes, opened for reading."""
        return Path(self.path).open("rb")

    def files(self, pattern: str) -> list[str]:
        """The file itself, or every file under the folder matching ``pattern``, sorted."""
        root = Path(self.path)
        return [self.path] if root.is_file() else sorted(map(str, root.rglob(pattern)))

    def local_file(self) -> str:
        return self.path

    def arrow(self) -> tuple[Any, str]:
        """No file system of its own: pyarrow opens the path."""
        return None, self.path

    def reachable(self) -> None:
        """A local path needs no store."""

    @property
    def store(self) -> None:
        """No store: the bytes are on this machine."""
        return None


@dataclass(frozen=True)
class StoredPlace:
    """An object, or a prefix of objects, in a store (``s3://``, ``gs://``, ``hf://``)."""

    url: str

    @property
    def text(self) -> str:
        """The URL, as its store's file system takes it."""
        return self.url

    @property
    def shown(self) -> str:
        return shown(self.url)

    @property
    def parent(self) -> StoredPlace:
        return StoredPlace(parent(self.url))

    @property
    def own_folder(self) -> StoredPlace:
        return self if kind_of(self.url) == "folder" else self.parent

    def kind(self) -> PlaceKind | None:
        """A prefix, an object, or nothing; a pattern is none of them, and the store is not
        asked about it."""
        if glob.has_magic(self.url):
            return None
        found = kind_of(self.url)
        return None if found is None else "folder" if found == "folder" else "file"

    def matches(self) -> list[str]:
        return glob_objects(self.url)

    def lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return objects_in(self.open(), self.shown)

    def open(self) -> BinaryIO:
        """Its bytes, read whole (an object store has no partial file to stream here)."""
        return io.BytesIO(read_whole(self.url))

    def files(self, pattern: str) -> list[str]:
        if kind_of(self.url) != "folder":
            return [self.url]
        return [u for u in list_objects(self.url) if fnmatch.fnmatch(object_name(u), pattern)]

    def local_file(self) -> str:
        """A local copy, made once per process (``objects.local_copy``)."""
        return local_copy(self.url)

    def arrow(self) -> tuple[Any, str]:
        from mmbatch.storage.objects import arrow_file_system

        return arrow_file_system(self.url)

    def reachable(self) -> None:
        file_system(self.url)

    @property
    def store(self) -> str:
        """The store's protocol, its aliases made one (``s3a`` is ``s3``)."""
        return protocol_of(self.url)


Place: TypeAlias = "LocalPlace | StoredPlace"
"""Where a named input's bytes live."""


def locate(text: str) -> Place:
    """Where ``text`` (a path or a URL, named once) lives: the one place that asks."""
    return StoredPlace(spelled(text)) if is_storage_url(text) else LocalPlace(text)
