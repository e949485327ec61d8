"""Where output rows go. A sink takes rows one at a time, makes the rows so far durable on
``flush`` (the pipeline calls it once per window) and everything on ``close``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from mmbatch.types import Request, Result


class Sink(Protocol):
    def write(self, row: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def output_row(request: Request, media_keys: tuple[str, ...], result: Result) -> dict[str, Any]:
    """The JSON row for one item: what it was, and its text or the reason it has none."""
    sources = [ref.source for ref in request.media]
    return {
        "id": request.id,
        "source": sources[0] if len(sources) == 1 else sources,
        "media_hash": media_keys[0] if len(media_keys) == 1 else (list(media_keys) or None),
        "prompt": request.prompt,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.usage.prompt_tokens,
        "output_tokens": result.usage.output_tokens,
        "cached_tokens": result.usage.cached_tokens,
        "error": result.error.to_dict() if result.error else None,
        **dict(request.columns),
    }


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
    torn last line (which ``mmbatch.resume`` repairs) and never half a row in the middle.

    Every row goes to the operating system at once, in a single ``write`` of the whole line
    on an ``O_APPEND`` descriptor: a SIGKILL loses no row that ``write`` returned from.
    ``flush`` fsyncs, so the rows also survive a power cut. ``append=True`` continues an
    existing file (resume); the default starts it afresh.
    """

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        if self.path.parent != Path(""):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._fd: int | None = os.open(self.path, flags, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(line)
        while view:  # a regular file takes the whole line at once; loop only to be sure
            view = view[os.write(self._require_open(), view) :]

    def flush(self) -> None:
        os.fsync(self._require_open())

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

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
