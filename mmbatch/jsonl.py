"""JSON lines, read and written one way everywhere: manifests, batch files, outputs, records.

Reading yields each non-blank line's JSON object with its line number, and raises
``JsonlError`` naming the file and line of the first one that is not an object; each caller
turns that into the error its users need (a bad manifest is a ``SourceError``, a damaged
output a ``ConfigError``). Writing encodes a row as one whole line (``encode_line``), and
replaces a file atomically (``write_atomic``): a reader, or a job killed half-way, sees the
old file or the new one, never a mix. A file replaced keeps its mode, and a new one gets the
mode the user's umask gives (not a temporary file's 600); a write that fails (a read-only
folder, a full disk) is an ``OutputError`` naming the file. A job killed during a write can
leave its temporary file behind: ``remove_orphans`` clears them before the next run.

File names need not be text: on Linux a name is bytes, and Python hands over a byte that is not
UTF-8 as a lone surrogate (``x_\xff.jpg`` arrives as ``"x_\udcff.jpg"``). Such a string opens
the file, but no UTF-8 writer takes it. ``encode_line`` keeps it exact (JSON's ``\udcff``
escape, which reads back as the same string); ``printable`` makes it text (``x_\\xff.jpg``)
where it must be valid Unicode: ids, Arrow columns, HTML.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from mmbatch.errors import OutputError


class JsonlError(ValueError):
    """A JSON-lines file that cannot be read as one object per line; the message names it."""


def read_objects(path: str | Path, end: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of ``path`` (of its first ``end``
    bytes, when given: a line running past them is not read)."""
    try:
        handle = Path(path).open("rb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise JsonlError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    with handle:
        yield from objects_in(handle, str(path), end)


def objects_in(
    lines: Iterable[bytes], name: str, end: int | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``read_objects`` over ``lines`` already at hand (an object read from storage),
    named ``name`` in what is said of them."""
    path = name
    offset = 0
    for line_no, line in enumerate(lines, start=1):
        offset += len(line)
        if end is not None and offset > end:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except UnicodeDecodeError as exc:
            raise JsonlError(
                f"{path}:{line_no}: not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                f"{exc.start + 1}); save the file as UTF-8"
            ) from None
        except ValueError as exc:
            raise JsonlError(f"{path}:{line_no}: not valid JSON ({exc})") from None
        except RecursionError:  # thousands of nested [ or {: no row is shaped so
            raise JsonlError(f"{path}:{line_no}: JSON nested too deeply to read") from None
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


def printable(text: str) -> str:
    """``text`` as valid Unicode: each byte the OS could not decode (a surrogate) is written
    as ``\\xNN`` (any other lone surrogate as ``\\uNNNN``); valid text is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no OS byte made (JSON's "\ud800")
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def printable_values(value: Any) -> Any:
    """``value`` (a row, or any JSON value) with every string made ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, Mapping):
        return {printable(str(k)): printable_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_values(v) for v in value]
    return value


def write_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Replace ``path`` by the JSON lines of ``rows`` (streamed, not held), atomically."""
    _replace(Path(path), lambda handle: handle.writelines(map(encode_line, rows)))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text``, atomically."""
    _replace(Path(path), lambda handle: handle.write(text.encode("utf-8")))


def remove_orphans(path: str | Path) -> int:
    """Remove the temporary files a killed ``write_atomic`` of ``path`` left; how many."""
    path = Path(path)
    removed = 0
    for orphan in path.parent.glob(f".{_glob_escape(path.name)}.*.tmp"):
        orphan.unlink(missing_ok=True)
        removed += 1
    return removed


def cannot_write(path: str | Path, exc: OSError) -> str:
    """The one line that says why ``path`` could not be written."""
    return f"cannot write {str(path)!r}: {exc.strerror or exc}"


def _replace(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through a temporary file in its folder, fsynced, then renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = _temporary(path)
    except OSError as exc:
        raise OutputError(cannot_write(path, exc)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            _keep_mode(path, handle.fileno())
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(cannot_write(path, exc)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _temporary(path: Path) -> tuple[Path, int]:
    """A new file beside ``path``, created with mode 666 less the umask (as ``open`` would)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue


def _keep_mode(path: Path, fd: int) -> None:
    """Give the replacement the mode of the file it replaces, if there is one."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    os.fchmod(fd, mode)


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


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
