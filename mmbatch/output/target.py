"""Where an output's bytes end up, decided once: its target.

A job's output (``mmbatch.output.file_output.FileOutput``) always writes to a local path,
and asks its target at each step what else to do: read what is there before resume
(``fetch``, ``remember_ids``, ``commit_resume``), send each file written beside the rows
(``upload_beside``), wrap the sink that writes the rows (``wrap``), read a row folder again
once Ray's writers have added to it (``refresh_folder``), and finish the report
(``finish``). An output on this machine's disk has nothing else to do: its target is a
null object (``LocalTarget``), every step a no-op. An output in object storage writes to a
local mirror, and its target is ``mmbatch.output.remote.RemoteOutput``, which commits the
mirror to the store.

``target_at`` is the one place that tells which an output is.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from mmbatch.errors import ConfigError, MmbatchError
from mmbatch.output.paths import OutputPaths
from mmbatch.output.remote import RemoteOutput, staging
from mmbatch.output.rows import RowShape
from mmbatch.output.sinks import Sink
from mmbatch.output.summary import JobReport
from mmbatch.storage.urls import LOGIN_REFUSED, is_storage_url, shown, spelled


class OutputTarget(Protocol):
    """What an output does besides writing its local files (see the module's docstring)."""

    @property
    def url(self) -> str | None:
        """The output's URL in object storage (None: on this machine's disk)."""
        ...

    def shown_as(self, path: Path) -> str:
        """The output as messages name it (``path``: its local rows)."""
        ...

    def translated(self, exc: MmbatchError) -> MmbatchError:
        """``exc``, said of the output where it is, not of where it is written first."""
        ...

    def fetch(self, paths: OutputPaths, shape: RowShape) -> None: ...

    def remember_ids(self, progress: Path, shape: RowShape) -> None: ...

    def commit_resume(self, paths: OutputPaths, shape: RowShape, pending: bool) -> None: ...

    def upload_beside(self, files: Iterable[Path]) -> None: ...

    def wrap(self, sink: Sink, paths: OutputPaths) -> Sink:
        """The sink that writes ``sink``'s rows where the output is."""
        ...

    def refresh_folder(self, paths: OutputPaths) -> None: ...

    def finish(self, report: JobReport, paths: OutputPaths) -> None:
        """What is left once the summary is written (``report`` names the output where it
        is)."""
        ...


class LocalTarget:
    """An output on this machine's disk: its local files are the output, so each step is
    a no-op (a null object, not an ``if`` in each step)."""

    url: str | None = None

    def shown_as(self, path: Path) -> str:
        return str(path)

    def translated(self, exc: MmbatchError) -> MmbatchError:
        return exc

    def fetch(self, paths: OutputPaths, shape: RowShape) -> None:
        """Nothing to fetch: the files are here."""

    def remember_ids(self, progress: Path, shape: RowShape) -> None:
        """Nothing to compare later: resume changes the output in place."""

    def commit_resume(self, paths: OutputPaths, shape: RowShape, pending: bool) -> None:
        """Nothing to commit: resume wrote the output itself."""

    def upload_beside(self, files: Iterable[Path]) -> None:
        """Nothing to upload: the files are where they belong."""

    def wrap(self, sink: Sink, paths: OutputPaths) -> Sink:
        return sink

    def refresh_folder(self, paths: OutputPaths) -> None:
        """A local row folder is read in place."""

    def finish(self, report: JobReport, paths: OutputPaths) -> None:
        """The report already names the local files."""


def target_at(path: str | Path) -> tuple[Path, OutputTarget]:
    """Where an output named ``path`` is written on this machine, and its target: the path
    itself and ``LocalTarget``, or for a URL in object storage its local mirror
    (``staging``) and a ``RemoteOutput``. ``ConfigError`` for a URL holding a login."""
    if not is_storage_url(str(path)):
        return Path(path), LocalTarget()
    url = spelled(str(path)).rstrip("/")
    if shown(url) != url:
        raise ConfigError(f"the output {shown(url)} {LOGIN_REFUSED}")
    mirror = staging(url)
    return mirror, RemoteOutput(url, mirror)


def in_store(path: str) -> bool:
    """Whether the output named ``path`` is kept in object storage (said before anything
    of it is read)."""
    return is_storage_url(path)


def local_rows(path: str) -> Path:
    """Where the rows of the output named ``path`` are written on this machine."""
    if not is_storage_url(path):
        return Path(path)
    return staging(spelled(path).rstrip("/"))
