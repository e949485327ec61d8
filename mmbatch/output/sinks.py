"""Where output rows go. A sink takes rows one at a time, makes the rows so far durable on
``flush`` (the pipeline calls it regularly) and everything on ``close``. Columnar files
(Parquet, datasets folders) are ``mmbatch.output.tables.TableSink``; ``mmbatch.output.formats``
picks the sink for an ``--out``."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from mmbatch.errors import OutputError
from mmbatch.jsonl import cannot_write, encode_line
from mmbatch.output.order import RowOrder


class Sink(Protocol):
    def write(self, row: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """Rows kept in a list: for tests, benchmarks and library callers that want values."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        """Nothing to make durable: the rows are already in memory."""

    def close(self) -> None:
        """Nothing to make durable: the rows are already in memory."""


class JsonlSink:
    """One JSON object per line, each written whole, so that a killed job leaves at most a
    torn last line (which ``mmbatch.output.resume`` repairs) and never half a row in the middle.

    Every row goes to the operating system at once, in a single ``write`` of the whole line
    on an ``O_APPEND`` descriptor: a SIGKILL loses no row that ``write`` returned from.
    ``flush`` fsyncs, so the rows also survive a power cut. ``append=True`` continues an
    existing file (resume); the default starts it afresh. Rows go down in the order their
    items finish; with an ``order``, ``close`` rewrites them in the job's input order. A new
    file gets the mode the user's umask gives. A write that fails (a read-only folder, a
    full disk) raises ``OutputError``: at most a torn last line is left, which resume
    repairs.
    """

    def __init__(
        self, path: str | Path, append: bool = False, order: RowOrder | None = None
    ) -> None:
        self.path = Path(path)
        self.order = order
        self._torn = False  # a write failed: the last line may be cut, the rows stay as written
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        try:
            if self.path.parent != Path(""):
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise OutputError(cannot_write(self.path, exc)) from None

    def write(self, row: dict[str, Any]) -> None:
        view = memoryview(encode_line(row))
        try:
            while view:  # a regular file takes the whole line at once; loop only to be sure
                view = view[os.write(self._require_open(), view) :]
        except OSError as exc:
            self._torn = True
            raise OutputError(cannot_write(self.path, exc)) from None

    def flush(self) -> None:
        try:
            os.fsync(self._require_open())
        except OSError as exc:
            raise OutputError(cannot_write(self.path, exc)) from None

    def close(self) -> None:
        """Make every row durable, then put the rows in the job's order (``order``); after a
        failed write they stay as written (the resumed run repairs the tail, then orders)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            except OSError as exc:
                raise OutputError(cannot_write(self.path, exc)) from None
            finally:
                os.close(fd)
            if self.order is not None and not self._torn:
                self.order.apply(self.path)

    def _require_open(self) -> int:
        if self._fd is None:
            raise ValueError(f"the sink for {self.path} is closed")
        return self._fd

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
