"""Resume a job from its own JSONL output: the output file is the progress record.

A row is keyed by its item id (``Request.row_id``: one row per item, however many prompts
it was asked), read back through the job's ``RowShape``, so resuming needs no side database
and works for every row shape (flat, recipe items, OpenAI batch lines). The
sink appends whole lines (``mmbatch.sinks.JsonlSink``), so a job killed at any moment
leaves every finished row intact and at most one torn last line, which is cut off here
before the job appends again. Rerunning the same command therefore:

1. checks that the file is an output of this job's shape, and that it was written by the
   same job (a fingerprint of model name and content, prompt, sampling and decode options,
   kept in ``OUT.job.json``): appending rows made with other settings would mix two jobs in
   one file, so that needs ``force``;
2. reads every whole row, checking each is one of the job's rows (a file with a line that
   is not is refused as it is, whatever ``force`` says: nothing that is not a job's output
   is ever modified), and only then repairs a torn last line;
3. skips every item that has a row, except, with ``retry_errors``, the items whose row is
   an error, and, unless ``force``, the items whose prompts differ from those their row
   records (an edited manifest row): those rows are removed first, atomically, so no id
   ever has two rows, and the items are done again.

Columnar outputs (Parquet, datasets folders) resume the same way through the JSONL spool
their sink writes rows to, and a folder of Ray's row files through the files themselves
(``mmbatch.output.folders.FolderRows``): one plan, the same checks and the same message for the
local runner and Ray's driver. The files are named in ``mmbatch.output.paths``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mmbatch.errors import ConfigError, OutputError
from mmbatch.jsonl import JsonlError, read_objects, write_atomic, write_text_atomic
from mmbatch.output.folders import FolderRows, folder_format, read_folder
from mmbatch.output.formats import read_output
from mmbatch.output.job_changes import differences
from mmbatch.output.paths import OutputPaths
from mmbatch.output.rows import RowShape, asked_of
from mmbatch.types import Request
from mmbatch.words import agreeing, counted

RECORD_VERSION = 1
_TAIL_CHUNK = 1 << 16


class JobFacts(Protocol):
    """What resume needs to know of a job (``mmbatch.jobs.Job`` is one)."""

    @property
    def requests(self) -> Sequence[Request]:
        """Every request of the job, those already done included."""
        ...

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        """What makes two runs the same job (kept in the job record)."""
        ...

    @property
    def shape(self) -> RowShape:
        """How a written row is read back."""
        ...


@dataclass(frozen=True)
class ResumePlan:
    """What is left to do, and what was found in the output."""

    pending: list[Request]
    kept_ok: int = 0
    kept_failed: int = 0
    retried: int = 0
    changed: int = 0
    """Items whose prompts differ from those their rows were written with (an edited
    manifest): their rows were removed, to be redone."""
    repaired_bytes: int = 0
    example_changed: str | None = None

    @property
    def pending_items(self) -> int:
        """The items left to do (a recipe item is several requests)."""
        return len({r.row_id for r in self.pending})

    def describe(self, out: str | Path) -> str | None:
        """A line for the user when anything was resumed or repaired, else None."""
        kept = self.kept_ok + self.kept_failed
        if not (kept or self.retried or self.changed or self.repaired_bytes):
            return None
        have = agreeing(kept, "has", "have")
        parts = [f"resuming {out}: {counted(kept, 'item')} already {have} a row"]
        if self.kept_failed:
            parts.append(f"{self.kept_failed} of them errors (--retry-errors redoes those)")
        if self.retried:
            parts.append(f"{self.retried} error rows removed to be retried")
        if self.changed:
            parts.append(
                f"{self.changed} items whose prompt changed since their row was written "
                f"(e.g. {self.example_changed!r}) are redone"
            )
        if self.repaired_bytes:
            parts.append(f"a torn last line ({self.repaired_bytes} bytes) was cut off")
        return ", ".join(parts) + f"; {counted(self.pending_items, 'item')} to do"


def prepare(
    paths: OutputPaths, job: JobFacts, *, force: bool = False, retry_errors: bool = False
) -> ResumePlan:
    """Make the output at ``paths`` ready for ``job`` to add its rows to, and return the
    requests that still need a row. Raises ``ConfigError``, before touching the rows, when
    they are not rows of ``job.shape``, or are another job's and ``force`` is off. The job
    record is the caller's to write (``write_record``), once the job is sure to start."""
    rows = _written(paths)
    try:
        return _prepare(rows, paths.record, job, force, retry_errors)
    except OSError as exc:
        raise OutputError(f"cannot use {str(rows.path)!r}: {exc.strerror or exc}") from None


def _prepare(
    written: WrittenRows, record: Path, job: JobFacts, force: bool, retry_errors: bool
) -> ResumePlan:
    if not written.has_rows():
        return ResumePlan(pending=list(job.requests))
    shape = job.shape
    written.check_is_output(shape, record)
    if not force:
        check_same_job(written.path, record, job.fingerprint)
    # Every whole row is read and checked before anything is cut or rewritten: a file holding
    # a line that is not one of this job's rows is refused as it is.
    asked = asked_of(job.requests)
    ok_ids: set[str] = set()
    failed_ids: set[str] = set()
    changed: set[str] = set()
    for row in written.whole_rows(shape):
        outcome = shape.outcome(row)
        item_id = outcome.request_id
        (ok_ids if outcome.ok else failed_ids).add(item_id)
        before = shape.asked(row) if item_id in asked and not force else None
        if before is not None and before != asked[item_id]:
            changed.add(item_id)
    repaired = written.repair()
    retried = failed_ids & asked.keys() if retry_errors else set()
    redo = retried | changed
    if redo:
        written.drop(shape, redo)
    done = (ok_ids | failed_ids) - redo
    return ResumePlan(
        pending=[r for r in job.requests if r.row_id not in done],
        kept_ok=len((ok_ids - redo) & asked.keys()),
        kept_failed=len((failed_ids - redo) & asked.keys()),
        retried=len(retried),
        changed=len(changed - retried),
        repaired_bytes=repaired,
        example_changed=min(changed - retried, default=None),
    )


class WrittenRows(Protocol):
    """The rows an earlier run left, as resume reads and repairs them: a JSONL file
    (``JsonlRows``) or a folder of Ray's row files (``mmbatch.output.folders.FolderRows``)."""

    @property
    def path(self) -> Path: ...

    def has_rows(self) -> bool:
        """Whether there is anything to resume from (``ConfigError`` for a path that cannot
        hold these rows)."""
        ...

    def check_is_output(self, shape: RowShape, record: Path) -> None:
        """``ConfigError`` for rows that are not an output of ``shape``, before any change."""
        ...

    def whole_rows(self, shape: RowShape) -> Iterator[dict[str, Any]]:
        """Every whole row, checked; ``repair`` then removes what was not whole."""
        ...

    def repair(self) -> int:
        """Remove what a killed writer left unfinished; the bytes removed."""
        ...

    def drop(self, shape: RowShape, ids: set[str]) -> None:
        """Remove the rows of ``ids`` (atomically), so each is redone and no id gets two."""
        ...


class JsonlRows:
    """Rows in one JSONL file, appended whole: at most a torn last line to cut off."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._whole_end: int | None = None

    def has_rows(self) -> bool:
        if self.path.is_dir():
            raise ConfigError(f"{self.path} is a folder; --out names the file the rows go to")
        return self.path.exists() and self.path.stat().st_size > 0

    def check_is_output(self, shape: RowShape, record: Path) -> None:
        _check_is_output(self.path, shape, record)

    def whole_rows(self, shape: RowShape) -> Iterator[dict[str, Any]]:
        self._whole_end = whole_rows_end(self.path)
        return read_rows(self.path, shape, end=self._whole_end)

    def repair(self) -> int:
        assert self._whole_end is not None, "whole_rows first"
        return _cut(self.path, self._whole_end)

    def drop(self, shape: RowShape, ids: set[str]) -> None:
        write_atomic(
            self.path, (row for row in read_rows(self.path, shape) if shape.row_id(row) not in ids)
        )


def _written(paths: OutputPaths) -> WrittenRows:
    if paths.row_folder:
        return FolderRows(paths.rows, folder_format(paths.format))
    return JsonlRows(paths.progress)


def written_rows(
    paths: OutputPaths, shape: RowShape, settled: bool = True
) -> Iterator[dict[str, Any]]:
    """Every row of the output at ``paths``, for counting: a JSONL file's checked
    (``read_rows``), a row folder's whole files, a finished columnar output read back.
    ``settled=False``: a row folder's writers may still be at work (Ray's, stopping), so a
    file that cannot be read whole is passed over rather than set aside: its writer may
    yet finish it, and the next run's resume sets it aside if it did not."""
    if paths.row_folder:
        return read_folder(paths.rows, folder_format(paths.format), shape, set_aside=settled)
    if paths.format == "jsonl":
        return read_rows(paths.rows, shape)
    return read_output(paths.rows)


def read_rows(
    path: str | Path, shape: RowShape, end: int | None = None
) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL output (its first ``end`` bytes), checked: each one of
    ``shape``'s rows, no item twice.

    Call ``repair_torn_tail`` first, or stop at ``whole_rows_end``: a bad line here is
    damage, not a torn write, and is raised (``ConfigError`` naming the line) rather than
    guessed around.
    """
    seen: set[str] = set()
    try:
        for line_no, row in read_objects(path, end):
            item_id = _row_id(row, shape, f"{path}:{line_no}")
            if item_id in seen:
                raise ConfigError(
                    f"{path}:{line_no}: a second row for id {item_id!r}; this file was not "
                    "written by one mmbatch job (write to another --out)"
                )
            seen.add(item_id)
            yield row
    except JsonlError as exc:
        raise ConfigError(
            f"{exc}; the output is damaged beyond a torn last line (fix or remove that line, "
            "or write to another --out)"
        ) from None


def _row_id(row: Mapping[str, Any], shape: RowShape, where: str) -> str:
    with suppress(KeyError, TypeError, ValueError, AttributeError):
        if shape.is_row(row):
            shape.outcome(row)
            return shape.row_id(row)
    raise ConfigError(f"{where}: not an output row of this job's kind")


def _check_is_output(out: Path, shape: RowShape, record: Path) -> None:
    """Refuse a file whose first line is not one of ``shape``'s rows before anything is cut
    from it or appended to it: nothing that is not a job's output is ever modified, ``force``
    or not. (A damaged line further down is refused by ``read_rows`` before any append.)
    A first line cut short by a kill, with the job's record beside it, is a torn row."""
    with out.open("rb") as handle:
        first = handle.readline()
    if not first.endswith(b"\n") and record.exists():
        return
    try:
        row = json.loads(first)
        _row_id(row, shape, str(out))
    except (ValueError, ConfigError):
        raise ConfigError(
            f"{out} is not an mmbatch output (its first line is not one of its rows); it is "
            "left as it is: name another --out"
        ) from None


def repair_torn_tail(path: str | Path) -> int:
    """Cut off a last line that a killed writer left unfinished; return the bytes removed.

    A whole line ends with a newline, which is the last byte its single ``write`` puts
    down; anything after the last newline is a torn row. A last line that has its newline
    but is not JSON (a power cut can leave zeros where data was due) is torn as well.
    """
    return _cut(Path(path), whole_rows_end(path))


def whole_rows_end(path: str | Path) -> int:
    """Where the whole rows of ``path`` end: the bytes ``repair_torn_tail`` keeps."""
    path = Path(path)
    keep = _end_of_last_line(path, path.stat().st_size)
    if keep > 0:
        start = _end_of_last_line(path, keep - 1)
        with path.open("rb") as handle:
            handle.seek(start)
            last = handle.read(keep - start)
        if not _is_json_object(last):
            keep = start
    return keep


def _cut(path: Path, keep: int) -> int:
    """Truncate ``path`` to ``keep`` bytes, durably; the bytes removed."""
    size = path.stat().st_size
    if keep < size:
        with path.open("r+b") as handle:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
    return size - keep


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """A stable digest of a job's settings (key order does not matter)."""
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_same_job(out: Path, record: Path, fingerprint: Mapping[str, Any]) -> None:
    """``ConfigError`` unless the job record ``record`` beside ``out`` is this job's, saying
    what changed in the user's words (``mmbatch.output.job_changes``) and the ways on."""
    how = (
        "use another --out, --overwrite to replace it once this job has finished, or --force "
        "to append to it (its rows are kept; the job record is replaced by this job's)"
    )
    try:
        stored = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{out} already has rows but no job record ({record.name}), so it cannot be "
            f"told whether they come from this job; {how}"
        ) from None
    except ValueError:
        raise ConfigError(f"the job record {record} is not JSON; {how}") from None
    if stored.get("digest") == fingerprint_digest(fingerprint):
        return
    changed = differences(stored.get("fingerprint", {}), fingerprint)
    if not changed:
        return  # the same model by another path, or settings this version added, unset
    raise ConfigError(f"{out} was written by a different job ({'; '.join(changed)}); {how}")


def write_record(record: Path, fingerprint: Mapping[str, Any]) -> None:
    body = {
        "version": RECORD_VERSION,
        "digest": fingerprint_digest(fingerprint),
        "fingerprint": dict(fingerprint),
    }
    write_text_atomic(record, json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")


def _end_of_last_line(path: Path, end: int) -> int:
    """The offset just past the last newline before ``end`` (0 if there is none)."""
    with path.open("rb") as handle:
        pos = end
        while pos > 0:
            start = max(0, pos - _TAIL_CHUNK)
            handle.seek(start)
            chunk = handle.read(pos - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                return start + newline + 1
            pos = start
    return 0


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
