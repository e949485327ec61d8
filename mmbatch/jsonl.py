"""JSON lines, read and written one way everywhere: manifests, batch files, outputs, records.

Reading yields each non-blank line's JSON object with its line number, and raises
``JsonlError`` naming the file and line of the first one that is not an object; each caller
turns that into the error its users need (a bad manifest is a ``SourceError``, a damaged
output a ``ConfigError``). Writing encodes a row as one whole line (``encode_line``), and
replaces a file atomically (``write_atomic``): a reader, or a job killed half-way, sees the
old file or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO


class JsonlError(ValueError):
    """A JSON-lines file that cannot be read as one object per line; the message names it."""


def read_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of ``path``."""
    try:
        handle = Path(path).open("rb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise JsonlError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    with handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for non-UTF-8
                raise JsonlError(f"{path}:{line_no}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise JsonlError(f"{path}:{line_no}: expected a JSON object, got {row!r}")
            yield line_no, row


def encode_line(row: Mapping[str, Any]) -> bytes:
    """``row`` as one UTF-8 line. Text is kept readable (no ``\\u`` escapes), except in a row
    holding a string that is not valid Unicode (a file name in another encoding, read by the
    OS as surrogates): that row is written all-ASCII, escapes and all, so it is still JSON."""
    try:
        return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(row, ensure_ascii=True) + "\n").encode("ascii")


def write_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Replace ``path`` by the JSON lines of ``rows`` (streamed, not held), atomically."""
    _replace(Path(path), lambda handle: handle.writelines(map(encode_line, rows)))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text``, atomically."""
    _replace(Path(path), lambda handle: handle.write(text.encode("utf-8")))


def _replace(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through a temporary file in its folder, fsynced, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not every platform lets a folder be opened; the rename is still atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | Path, chunks: Iterable[bytes]) -> None:
    """Replace ``path`` by the concatenation of ``chunks`` (streamed), atomically."""
    _replace(Path(path), lambda handle: handle.writelines(chunks))
