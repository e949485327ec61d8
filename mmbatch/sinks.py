"""Where output rows go. A sink takes rows one at a time and makes them durable on close."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from mmbatch.types import Request, Result


class Sink(Protocol):
    def write(self, row: dict[str, Any]) -> None: ...

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
    }


class MemorySink:
    """Rows kept in a list: for tests, benchmarks and library callers that want values."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def close(self) -> None:
        """Nothing to make durable: the rows are already in memory."""


class JsonlSink:
    """One JSON object per line. Each row is written whole; ``flush`` makes rows durable."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.parent != Path(""):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if not self._handle.closed:
            self.flush()
            self._handle.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
