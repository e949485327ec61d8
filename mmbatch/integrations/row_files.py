"""Read back a folder of output rows written by Ray's writers (JSON lines or Parquet).

Resume and the final one-row-per-input check both need to know which ids are already on
disk. Ray's file writers are not atomic: a job killed mid-write can leave a truncated file,
which would make every later reader of the folder fail. Such a file is renamed with a
leading dot (``.partial-NAME``), which Ray and pyarrow skip when they list a folder, and its
ids count as not written, so the next run produces them again.

Only pyarrow is needed here (no ray), so this is tested without a cluster.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmbatch.errors import SourceError
from mmbatch.sources import jsonl_objects

RowFormat = Literal["jsonl", "parquet"]
"""The writers the Ray runner offers: ``Dataset.write_json`` (one JSON object per line, in
``.json`` files) and ``Dataset.write_parquet``; named as ``--out-format`` names them."""

ROW_FORMATS: tuple[RowFormat, ...] = ("jsonl", "parquet")
SUFFIXES: dict[RowFormat, str] = {"jsonl": ".json", "parquet": ".parquet"}
PARTIAL_PREFIX = ".partial-"


@dataclass
class RowCounts:
    """What the rows in an output folder say: how many, which failed where, tokens."""

    ids: Counter[str] = field(default_factory=Counter)
    ok: int = 0
    failed_by_stage: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    output_tokens: int = 0
    set_aside: list[Path] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.failed_by_stage.values())

    @property
    def rows(self) -> int:
        return self.ok + self.failed

    def add(self, row: dict[str, Any]) -> None:
        self.ids[str(row["id"])] += 1
        error = row.get("error")
        if error:
            self.failed_by_stage[str(error.get("stage"))] += 1
        else:
            self.ok += 1
        self.prompt_tokens += int(row.get("prompt_tokens") or 0)
        self.output_tokens += int(row.get("output_tokens") or 0)


def read_row_files(folder: Path, fmt: RowFormat) -> RowCounts:
    """Count the rows of every complete ``fmt`` file under ``folder``; set partial ones aside."""
    counts = RowCounts()
    if not folder.exists():
        return counts
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "_")) or not path.is_file():
            continue
        if path.suffix != SUFFIXES[fmt]:
            raise ValueError(
                f"{path} is not a {SUFFIXES[fmt]} file; the output folder must hold only this "
                f"job's {fmt} rows (use a new folder, or the format it was written in)"
            )
        try:
            rows = _read_rows(path, fmt)
        except (ValueError, OSError) as exc:
            aside = path.with_name(PARTIAL_PREFIX + path.name)
            path.rename(aside)
            counts.set_aside.append(aside)
            print(f"mmbatch: set aside the unreadable output file {path} ({exc})", file=sys.stderr)
            continue
        for row in rows:
            counts.add(row)
    return counts


def _read_rows(path: Path, fmt: RowFormat) -> list[dict[str, Any]]:
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = ["id", "error", "prompt_tokens", "output_tokens"]
        try:
            table = pq.read_table(path, columns=columns)
        except pa.ArrowException as exc:
            raise ValueError(str(exc)) from exc
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows
    rows = []
    try:
        for line_no, row in jsonl_objects(path):
            if "id" not in row:
                raise ValueError(f"line {line_no} is not an output row")
            rows.append(row)
    except SourceError as exc:  # a torn or foreign line: the caller sets the file aside
        raise ValueError(str(exc)) from None
    return rows
