"""Where output rows go. A sink takes rows one at a time, makes the rows so far durable on
``flush`` (the pipeline calls it regularly) and everything on ``close``. Columnar files
(Parquet, datasets folders) are ``mmbatch.out.tables.TableSink``; ``mmbatch.out.formats``
picks the sink for an ``--out``."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from mmbatch.jsonl import encode_line
from mmbatch.out.order import RowOrder


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
    torn last line (which ``mmbatch.out.resume`` repairs) and never half a row in the middle.

    Every row goes to the operating system at once, in a single ``write`` of the whole line
    on an ``O_APPEND`` descriptor: a SIGKILL loses no row that ``write`` returned from.
    ``flush`` fsyncs, so the rows also survive a power cut. ``append=True`` continues an
    existing file (resume); the default starts it afresh. Rows go down in the order their
    items finish; with an ``order``, ``close`` rewrites them in the job's input order.
    """

    def __init__(
        self, path: str | Path, append: bool = False, order: RowOrder | None = None
    ) -> None:
        self.path = Path(path)
        self.order = order
        if self.path.parent != Path(""):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._fd: int | None = os.open(self.path, flags, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        view = memoryview(encode_line(row))
        while view:  # a regular file takes the whole line at once; loop only to be sure
            view = view[os.write(self._require_open(), view) :]

    def flush(self) -> None:
        os.fsync(self._require_open())

    def close(self) -> None:
        """Make every row durable, then put the rows in the job's order (``order``)."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            if self.order is not None:
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
