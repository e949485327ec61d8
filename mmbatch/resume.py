"""Resume a job from its own JSONL output: the output file is the progress record.

A row is keyed by its ``id``, the item id (``Request.row_id``: one row per item, however
many prompts it was asked), so resuming needs no side database and works
for any JSONL output whose rows carry ``id`` and ``error``, whatever else they hold. The
sink appends whole lines (``mmbatch.sinks.JsonlSink``), so a job killed at any moment
leaves every finished row intact and at most one torn last line, which is cut off here
before the job appends again. Rerunning the same command therefore:

1. checks that the output was written by the same job (a fingerprint of model, prompt,
   sampling and decode options, kept in ``OUT.job.json``): appending rows made with
   other settings would mix two jobs in one file, so that needs ``force``;
2. repairs a torn last line;
3. skips every item that has a row, or with ``retry_errors`` every item that has an
   ``ok`` row (error rows are removed first, atomically, so no id ever has two rows).

After the job, ``finish`` writes the quarantine file (``OUT.quarantine.jsonl``: the failed
inputs with their reasons) from the output's rows, so it always agrees with the output.
Columnar outputs (Parquet, datasets folders) resume the same way through the JSONL spool
their sink writes rows to.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmbatch.errors import ConfigError
from mmbatch.types import Request

RECORD_VERSION = 1
_TAIL_CHUNK = 1 << 16


def job_record_path(out: str | Path) -> Path:
    """Where the fingerprint of the job writing ``out`` is kept."""
    out = Path(out)
    return out.with_name(out.name + ".job.json")


def quarantine_path(out: str | Path) -> Path:
    """Where the failed inputs of the job writing ``out`` are listed."""
    out = Path(out)
    return out.with_name(out.name + ".quarantine.jsonl")


@dataclass(frozen=True)
class ResumePlan:
    """What is left to do, and what was found in the output."""

    pending: list[Request]
    kept_ok: int = 0
    kept_failed: int = 0
    retried: int = 0
    repaired_bytes: int = 0

    def describe(self, out: str | Path) -> str | None:
        """A line for the user when anything was resumed or repaired, else None."""
        kept = self.kept_ok + self.kept_failed
        if not (kept or self.retried or self.repaired_bytes):
            return None
        parts = [f"resuming {out}: {kept} items already have a row"]
        if self.kept_failed:
            parts.append(f"{self.kept_failed} of them errors (--retry-errors redoes those)")
        if self.retried:
            parts.append(f"{self.retried} error rows removed to be retried")
        if self.repaired_bytes:
            parts.append(f"a torn last line ({self.repaired_bytes} bytes) was cut off")
        return ", ".join(parts) + f"; {len(self.pending)} items to do"


@dataclass
class OutputTally:
    """The rows of an output that belong to a job's items, counted."""

    ok: int = 0
    failed: int = 0
    failed_by_stage: Counter[str] = field(default_factory=Counter)
    failed_by_kind: Counter[str] = field(default_factory=Counter)
    quarantine: Path | None = None


def prepare(
    out: str | Path,
    requests: Sequence[Request],
    fingerprint: Mapping[str, Any],
    *,
    record: str | Path | None = None,
    force: bool = False,
    retry_errors: bool = False,
) -> ResumePlan:
    """Make the JSONL file ``out`` ready to be appended to by the job ``fingerprint``
    describes, and return the requests that still need a row. The fingerprint is kept in
    ``record`` (default ``OUT.job.json``). Raises ``ConfigError`` (before touching ``out``)
    when ``out`` holds another job's rows and ``force`` is off."""
    out = Path(out)
    record = Path(record) if record is not None else job_record_path(out)
    if not out.exists() or out.stat().st_size == 0:
        _write_record(record, fingerprint)
        return ResumePlan(pending=list(requests))
    if not force:
        _check_same_job(out, record, fingerprint)
    repaired = repair_torn_tail(out)
    wanted = {r.row_id for r in requests}
    retried = _drop_error_rows(out, wanted) if retry_errors else 0
    ok_ids: set[str] = set()
    failed_ids: set[str] = set()
    for row in read_rows(out):
        (ok_ids if row.get("error") is None else failed_ids).add(str(row["id"]))
    _write_record(record, fingerprint)
    done = ok_ids | failed_ids
    return ResumePlan(
        pending=[r for r in requests if r.row_id not in done],
        kept_ok=len(ok_ids & wanted),
        kept_failed=len(failed_ids & wanted),
        retried=retried,
        repaired_bytes=repaired,
    )


def finish(
    rows: Iterable[Mapping[str, Any]], requests: Sequence[Request], quarantine: str | Path
) -> OutputTally:
    """Count the job's ``rows`` (an output's, read back) and write the ``quarantine`` file
    (removing a stale one when nothing failed)."""
    wanted = {r.row_id for r in requests}
    tally = OutputTally()
    quarantined: list[dict[str, Any]] = []
    for row in rows:
        if str(row["id"]) not in wanted:
            continue
        error = row.get("error")
        if error is None:
            tally.ok += 1
            continue
        tally.failed += 1
        entry = quarantine_row(row)
        tally.failed_by_stage[str(entry["stage"])] += 1
        tally.failed_by_kind[str(entry["kind"])] += 1
        quarantined.append(entry)
    path = Path(quarantine)
    if quarantined:
        write_rows(path, quarantined)
        tally.quarantine = path
    elif path.exists():
        path.unlink()
    return tally


def quarantine_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The quarantine entry of an error row: which input, and why it failed."""
    error = row["error"] if isinstance(row.get("error"), dict) else {"message": row.get("error")}
    return {
        "id": row["id"],
        "source": row.get("source"),
        "stage": error.get("stage"),
        "kind": error.get("kind") or "other",
        "message": error.get("message"),
    }


def write_rows(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write ``rows`` as JSONL to ``path`` atomically (whole new file or the old one)."""
    _atomic_write(Path(path), lambda write: [write(_line(row)) for row in rows])


def repair_torn_tail(path: str | Path) -> int:
    """Cut off a last line that a killed writer left unfinished; return the bytes removed.

    A whole line ends with a newline, which is the last byte its single ``write`` puts
    down; anything after the last newline is a torn row. A last line that has its newline
    but is not JSON (a power cut can leave zeros where data was due) is torn as well.
    """
    path = Path(path)
    size = path.stat().st_size
    keep = _end_of_last_line(path, size)
    if keep > 0:
        start = _end_of_last_line(path, keep - 1)
        with path.open("rb") as handle:
            handle.seek(start)
            last = handle.read(keep - start)
        if not _is_json_object(last):
            keep = start
    if keep < size:
        with path.open("r+b") as handle:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
    return size - keep


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL output, checked: each a JSON object with an ``id``, no id twice.

    Call ``repair_torn_tail`` first: a bad line here is corruption, not a torn write, and is
    raised (``ConfigError`` naming the line) rather than guessed around.
    """
    seen: set[str] = set()
    with Path(path).open("rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ConfigError(
                    f"{path}:{line_no} is not a JSON row; the output is damaged beyond a torn "
                    "last line (fix or remove that line, or write to another --out)"
                ) from None
            if not isinstance(row, dict) or "id" not in row:
                raise ConfigError(f"{path}:{line_no}: not an output row (no 'id')")
            item_id = str(row["id"])
            if item_id in seen:
                raise ConfigError(
                    f"{path}:{line_no}: a second row for id {item_id!r}; this file was not "
                    "written by one mmbatch job (write to another --out)"
                )
            seen.add(item_id)
            yield row


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """A stable digest of a job's settings (key order does not matter)."""
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_same_job(out: Path, record: Path, fingerprint: Mapping[str, Any]) -> None:
    how = (
        "use another --out, or pass --force to append to it anyway (its rows are kept; "
        "the job record is replaced by this job's)"
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
    before = stored.get("fingerprint", {})
    keys = before.keys() | fingerprint.keys()
    changed = sorted(k for k in keys if before.get(k) != fingerprint.get(k))
    details = "; ".join(
        f"{k}: {json.dumps(before.get(k), default=str)} -> "
        f"{json.dumps(fingerprint.get(k), default=str)}"
        for k in changed
    )
    raise ConfigError(
        f"{out} was written by a different job ({details or 'settings differ'}); {how}"
    )


def _write_record(record: Path, fingerprint: Mapping[str, Any]) -> None:
    body = {
        "version": RECORD_VERSION,
        "digest": fingerprint_digest(fingerprint),
        "fingerprint": dict(fingerprint),
    }
    text = json.dumps(body, indent=2, sort_keys=True, default=str) + "\n"
    _atomic_write(record, lambda write: write(text))


def _drop_error_rows(out: Path, ids: set[str]) -> int:
    """Rewrite ``out`` without the error rows of ``ids`` (atomically); return how many."""
    dropped = 0

    def copy(write: Callable[[str], object]) -> None:
        nonlocal dropped
        for row in read_rows(out):
            if row.get("error") is not None and str(row["id"]) in ids:
                dropped += 1
            else:
                write(_line(row))

    _atomic_write(out, copy)
    return dropped


def _atomic_write(path: Path, fill: Callable[[Callable[[str], object]], object]) -> None:
    """Write ``path`` through a temporary file in its folder, fsync, then rename over it, so
    a reader (or a killed job) sees the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fill(handle.write)
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


def _line(row: Mapping[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


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
