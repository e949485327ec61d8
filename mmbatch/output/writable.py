"""Whether an output can be written, asked before a job starts anything.

A job writes several files beside its output (the job record, the summary, the quarantine
file, vLLM's log, a columnar output's spool) and replaces them through temporary files in
the same folder. A read-only folder found only when the first of them is written is found
late (after the engine has loaded, a minute into a GPU job) and blamed on whichever file came
first; asked here, before the decode workers and the engine start and before vLLM is
imported, it is one line that names the folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mmbatch.errors import OutputError
from mmbatch.jsonl import cannot_write


def check_writable(out: Path, appended: Iterable[Path | None] = ()) -> None:
    """``OutputError`` naming the folder when the files of the output ``out`` cannot be made
    there: the folder (or, not made yet, the nearest folder above it, where it will be) must
    take a new file, and each file of ``appended`` that exists (the rows, vLLM's log: files
    appended to) must open for writing. Nothing is changed: the file made to find out is
    removed at once (and named as ``mmbatch.jsonl.remove_orphans`` clears, were the job
    killed meanwhile)."""
    _probe(out.absolute().parent, out.name, f"{out.name}, its job record, summary and logs")
    for path in appended:
        if path is None or not path.is_file():
            continue
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            raise OutputError(cannot_write(path, exc)) from None


def check_folder_writable(folder: Path, what: str) -> None:
    """``OutputError`` naming ``folder`` when ``what`` (saved frames, say) cannot be
    written there: asked as for the output, so that a read-only folder is one line before
    the job starts, not an error on every item blamed on its media."""
    _probe(folder.absolute(), "mmbatch", what)


def _probe(folder: Path, name: str, what: str) -> None:
    """Make and remove a file in ``folder`` (or, not made yet, the nearest folder above it,
    where it will be); ``OutputError`` saying ``what`` goes there when that fails."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(
            f"cannot write in the folder {str(folder)!r} (where {what} go): {exc.strerror or exc}"
        ) from None
    os.close(handle)
    os.unlink(probe)
