"""An output in object storage (``--out s3://bucket/prefix/out.jsonl``), and how it commits.

An object store has no append and no rename: an object is written whole, by one PUT, and
becomes visible whole or not at all. So the rows do not go to ``OUT`` as they finish, as
they do on a local disk; they go to small immutable *part* objects beside it, and ``OUT``
is assembled from them when the job closes:

    OUT.parts/00000007-3f9a1c2b.jsonl       rows, as they finished (one PUT per flush)
    OUT.parts/00000008-3f9a1c2b.drop.json   ids whose earlier rows no longer count
                                            (--retry-errors, an edited manifest row)
    OUT.parts/assembled.json                OUT is whole and holds these parts (short-lived)
    OUT, OUT.job.json, OUT.summary.json, OUT.quarantine.jsonl, OUT.vllm.log

What the output holds (the truth a resume starts from) is, at any moment:

* ``assembled.json`` there: ``OUT`` (the last assembly was whole before the marker was
  written); the parts it lists are deleted, then the marker;
* else, parts there: the parts, read in sequence order, later rows of an id replacing
  earlier ones and a drop removing them (``OUT``, if any, is an older or half-written
  assembly and is not read);
* else ``OUT``, if it exists (a finished job), else nothing.

A job killed at any moment therefore loses no row whose part was written, and duplicates
none: a part's rows are in the truth, or its PUT never finished and they are done again;
an assembly half-uploaded is ignored while the parts are there; a clean-up half-done is
finished by the next run. A run that changes a finished output (rows to drop, items to add)
first writes its rows back as part 0, so that the truth never rests on a half-written
``OUT``.

The job works on a local mirror of the output (``staging``): the truth is downloaded into
it, resume runs there exactly as for a local output (``mmbatch.output.resume``), each part
is PUT before its rows are written to the mirror (the mirror holds no row the store does
not), the mirror's output is assembled as a local output is (rows in input order, Parquet,
shards, a datasets folder) and then uploaded. The files beside the output go up whole when
they are written. A folder of Ray's row files (``row_folder``) has no parts: each of Ray's
files is one PUT already, read in place; what resume changes in it (an error row to redo, a
file that cannot be read) is uploaded back.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmbatch.errors import MmbatchError, StorageError, StorageUnavailable
from mmbatch.jsonl import encode_line, objects_in, read_objects, write_bytes_atomic
from mmbatch.output.paths import OutputPaths
from mmbatch.output.rows import RowShape
from mmbatch.output.sinks import Sink
from mmbatch.output.summary import JobReport
from mmbatch.storage.objects import (
    delete_objects,
    download,
    kind_of,
    list_beside,
    list_objects,
    put_file,
    put_object,
    read_whole,
)
from mmbatch.storage.urls import name, parent, shown, spelled

PARTS = ".parts"
MARKER = "assembled.json"
PART_ROWS = 1000
PART_BYTES = 8 * 1024**2
"""A part is written at each of the pipeline's flushes (every two seconds), or sooner once
it holds this many rows or bytes."""


def staging(url: str) -> Path:
    """The local mirror of the output ``url``: a folder of this user's own under the
    temporary folder, named by the URL, holding the output under its own name."""
    digest = hashlib.sha256(spelled(url).encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir(), f"mmbatch-{uid}", "outputs", digest, name(url))


@dataclass
class RemoteOutput:
    """The output at ``url`` and its local mirror ``local`` (``staging``)."""

    url: str
    local: Path
    parts: list[str] = field(default_factory=list)
    """The part objects the truth was read from, in sequence order (this run's added)."""
    ids: set[str] = field(default_factory=set)
    """The ids the mirror held once the truth was read (before resume changed anything)."""
    folder: dict[str, str] = field(default_factory=dict)
    """A row folder's files as downloaded: name -> digest."""
    written: bool = False
    """Whether this run wrote rows or drops (the output must be assembled again)."""
    token: str = field(default_factory=lambda: secrets.token_hex(4))

    @property
    def parts_url(self) -> str:
        return self.url + PARTS

    def remote(self, local: Path) -> str:
        """The URL of a file of the mirror: the same name beside ``url``."""
        relative = local.relative_to(self.local.parent).as_posix()
        return f"{parent(self.url)}/{relative}"

    def shown(self, text: str) -> str:
        """``text`` (a message about the mirror) naming the store's objects instead."""
        return text.replace(str(self.local.parent), shown(parent(self.url)))

    def shown_as(self, path: Path) -> str:
        """The output as messages name it: its URL (``path`` is its mirror)."""
        return shown(self.url)

    def translated(self, exc: MmbatchError) -> MmbatchError:
        """``exc``, said of the store's objects rather than of the local mirror."""
        return translated(self, exc)

    def wrap(self, sink: Sink, paths: OutputPaths) -> Sink:
        """A sink that puts each flush's rows in a part before the mirror's ``sink`` gets
        them, and publishes the output when it closes (``PartSink``)."""
        return PartSink(sink, self, paths)

    # -- reading the truth --------------------------------------------------------------

    def fetch(self, paths: OutputPaths, shape: RowShape) -> None:
        """Make the mirror what the store holds: the job record, the summary, and the
        truth's rows (the module's docstring), a clean-up left half-done finished first.
        A write is tried first, so that a store that refuses one says so now, before any
        engine starts."""
        self.parts, self.ids, self.folder, self.written = [], set(), {}, False
        self.clear()
        self.local.parent.mkdir(parents=True)
        # A write first: a store that refuses one says so now. The one listing that follows
        # finds everything the output holds (and this probe, and any a killed run left).
        probe = f"{self.parts_url}/probe-{self.token}"
        try:
            put_object(probe, b"")
        except (StorageError, StorageUnavailable) as exc:  # said of the output named
            if isinstance(exc, StorageError):
                kind_of(self.url)  # a bucket that does not exist: said so, by its name
            raise type(exc)(str(exc).replace(shown(probe), shown(self.url))) from None
        found = set(list_beside(self.url))
        delete_objects(sorted(u for u in found if name(u).startswith("probe-")))
        if self.url in found and paths.row_folder:
            return  # a file where a folder is wanted: the folder's check says so
        self._finish_cleanup(found)
        for side in (paths.record, paths.summary):
            if self.remote(side) in found:
                download(self.remote(side), side)
        held = sorted(u for u in found if u.startswith(self.url + "/"))
        if paths.row_folder:
            self._fetch_folder(paths, held)
            return
        self.parts = self._list_parts(found)
        if self.parts:
            _write_rows(paths.progress, self._fold(shape).values())
        elif self.url in found or held:
            self._download_output(paths, held)

    def clear(self) -> None:
        """Remove the local mirror (what it held is in the store)."""
        shutil.rmtree(self.local.parent, ignore_errors=True)

    def _finish_cleanup(self, found: set[str]) -> None:
        marker = f"{self.parts_url}/{MARKER}"
        if marker not in found:
            return
        listed = json.loads(read_whole(marker)).get("parts", [])
        gone = [f"{self.parts_url}/{part}" for part in listed]
        delete_objects(gone)
        delete_objects([marker])
        found -= {marker, *gone}

    def _list_parts(self, found: set[str]) -> list[str]:
        names = [name(u) for u in found if u.startswith(self.parts_url + "/")]
        return sorted(n for n in names if n[:8].isdigit() and n.endswith((".jsonl", ".json")))

    def _fold(self, shape: RowShape) -> dict[str, dict[str, Any]]:
        """The parts' rows by id: read in sequence order, a later row of an id replacing an
        earlier one, a drop removing them."""
        rows: dict[str, dict[str, Any]] = {}
        for part in self.parts:
            url = f"{self.parts_url}/{part}"
            data = read_whole(url)
            if part.endswith(".drop.json"):
                for item_id in json.loads(data)["ids"]:
                    rows.pop(item_id, None)
                continue
            for _, row in objects_in(data.splitlines(keepends=True), shown(url)):
                rows[shape.row_id(row)] = row
        return rows

    def _download_output(self, paths: OutputPaths, held: list[str]) -> None:
        """The output's object, or the objects of its folder (``held``), into the mirror."""
        if not held:
            download(self.url, paths.rows)
            return
        for url in held:
            target = paths.rows / url[len(self.url) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            download(url, target)

    def _fetch_folder(self, paths: OutputPaths, held: list[str]) -> None:
        if held:
            self._download_output(paths, held)
        self.folder = _digests(paths.rows)

    # -- after resume ---------------------------------------------------------------------

    def remember_ids(self, progress: Path, shape: RowShape) -> None:
        """The ids of the mirror's rows as read, for ``commit_resume`` to tell what resume
        dropped."""
        self.ids = _ids(progress, shape)

    def commit_resume(self, paths: OutputPaths, shape: RowShape, pending: bool) -> None:
        """Write what resume changed in the mirror to the store: a drop of the rows it
        removed; or, where the truth was a finished output that this run will change, its
        rows as part 0 (``pending``: items are left to do)."""
        if paths.row_folder:
            self._sync_folder(paths.rows)
            return
        left = _ids(paths.progress, shape)
        dropped = sorted(self.ids - left)
        if self.parts:
            if dropped:
                self._put_part(json.dumps({"ids": dropped}).encode(), ".drop.json")
        elif left and (pending or dropped):
            self._put_part(paths.progress.read_bytes(), ".jsonl")

    def _put_part(self, data: bytes, suffix: str) -> None:
        sequence = int(self.parts[-1][:8]) + 1 if self.parts else 0
        part = f"{sequence:08d}-{self.token}{suffix}"
        put_object(f"{self.parts_url}/{part}", data)
        self.parts.append(part)
        self.written = True

    def put_rows(self, rows: list[dict[str, Any]]) -> None:
        """One part holding ``rows``."""
        self._put_part(b"".join(map(encode_line, rows)), ".jsonl")

    def _sync_folder(self, folder: Path) -> None:
        """Upload what changed in the mirror of a row folder since it was downloaded (a
        file rewritten without some rows, a file set aside under a new name), then remove
        what is gone from it."""
        now = _digests(folder)
        for relative, digest in now.items():
            if self.folder.get(relative) != digest:
                put_file(f"{self.url}/{relative}", folder / relative)
        gone = [f"{self.url}/{relative}" for relative in self.folder.keys() - now.keys()]
        delete_objects(gone)
        self.folder = now

    def refresh_folder(self, paths: OutputPaths) -> None:
        """Download a row folder again, once another process (Ray's writers) added to it."""
        shutil.rmtree(paths.rows, ignore_errors=True)
        held = list_objects(self.url) if kind_of(self.url) == "folder" else []
        self._fetch_folder(paths, held)

    # -- closing ---------------------------------------------------------------------------

    def publish(self, paths: OutputPaths) -> None:
        """Upload the mirror's assembled output, then commit it: the marker listing the
        parts it holds, the parts deleted, the marker deleted."""
        if not (self.written or self.parts):
            return  # the store already holds this output, assembled
        rows = paths.rows
        if rows.is_dir():
            uploaded = []
            for file in sorted(p for p in rows.rglob("*") if p.is_file()):
                uploaded.append(f"{self.url}/{file.relative_to(rows).as_posix()}")
                put_file(uploaded[-1], file)
            if kind_of(self.url) == "folder":
                delete_objects(sorted(set(list_objects(self.url)) - set(uploaded)))
        else:
            put_file(self.url, rows)
        marker = f"{self.parts_url}/{MARKER}"
        put_object(marker, json.dumps({"parts": self.parts}).encode())
        delete_objects([f"{self.parts_url}/{part}" for part in self.parts])
        delete_objects([marker])
        self.parts, self.written = [], False

    def finish(self, report: JobReport, paths: OutputPaths) -> None:
        """Once the summary is written in the mirror: the files beside the output go up,
        the report names the store's objects, and the mirror goes (a row folder's stays,
        which Ray's writers fill in the store)."""
        self.upload_beside([paths.vllm_log, paths.quarantine, paths.summary])
        report.out, report.summary_path = shown(self.url), self.remote(paths.summary)
        if report.output.quarantine is not None:
            report.output.quarantine = self.remote(paths.quarantine)
        if not paths.row_folder:
            self.clear()  # all it held is in the store now

    def upload_beside(self, files: Iterable[Path]) -> None:
        """Upload the files written beside the output (its record, quarantine, summary,
        vLLM's log), each whole, in the order given; one not there is removed."""
        for local in files:
            if local.is_file():
                put_file(self.remote(local), local)
            elif local.name.endswith(".quarantine.jsonl"):
                delete_objects([self.remote(local)])


class PartSink:
    """A sink for an output in storage: rows gather until a flush (or ``PART_ROWS``,
    ``PART_BYTES``), go up as one part, and only then to the mirror's own sink (``inner``),
    which assembles the output when it closes; the assembly is then published."""

    def __init__(self, inner: Sink, remote: RemoteOutput, paths: OutputPaths) -> None:
        self.inner, self.remote, self.paths = inner, remote, paths
        self._rows: list[dict[str, Any]] = []
        self._bytes = 0

    def write(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        self._bytes += len(encode_line(row))
        if len(self._rows) >= PART_ROWS or self._bytes >= PART_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self.remote.put_rows(self._rows)
            for row in self._rows:
                self.inner.write(row)
            self._rows, self._bytes = [], 0
        self.inner.flush()

    def close(self) -> None:
        self.flush()
        self.inner.close()
        self.remote.publish(self.paths)


def _write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_bytes_atomic(path, map(encode_line, rows))


def _ids(progress: Path, shape: RowShape) -> set[str]:
    if not progress.is_file():
        return set()
    try:
        return {shape.row_id(row) for _, row in read_objects(progress)}
    except (ValueError, KeyError, TypeError):
        return set()  # not rows of this job: resume refuses the output as it is


def _digests(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {
        file.relative_to(folder).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(folder.rglob("*"))
        if file.is_file()
    }


def translated(remote: RemoteOutput | None, exc: MmbatchError) -> MmbatchError:
    """``exc``, said of the store's objects rather than of the local mirror."""
    if remote is None:
        return exc
    message = remote.shown(str(exc))
    if message == str(exc):
        return exc
    again = type(exc)(message)
    again.__cause__ = exc.__cause__
    return again
