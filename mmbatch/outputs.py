"""Where a job's rows go, how they are read back, and the summary written beside them.

``--out`` picks the writer: ``x.parquet`` a Parquet file, ``--out-format datasets`` a
datasets folder (``save_to_disk``), anything else JSONL, one row per line. Every job also
writes ``OUT.summary.json`` (counts, throughput, cache hit rates, what was run), which is
what ``mmbatch report`` shows at the top of the gallery.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from mmbatch.errors import ConfigError, SourceError
from mmbatch.sinks import JsonlSink, Sink

OutputFormat = Literal["jsonl", "parquet", "datasets"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("jsonl", "parquet", "datasets")


def output_format(out: str | Path, requested: str | None = None) -> OutputFormat:
    """The format ``requested``, else the one ``out``'s name implies."""
    if requested is not None:
        if requested not in OUTPUT_FORMATS:
            raise ConfigError(f"unknown output format {requested!r}; expected {OUTPUT_FORMATS}")
        return requested
    return "parquet" if Path(out).suffix.lower() == ".parquet" else "jsonl"


def open_sink(out: str | Path, format: OutputFormat, append: bool = False) -> Sink:
    """A sink writing ``format`` to ``out``; ``append`` continues a stopped job's rows."""
    if format == "jsonl":
        return JsonlSink(out, append=append)
    from mmbatch.table_sinks import TableSink

    return TableSink(out, format, append=append)


def read_rows(out: str | Path) -> list[dict[str, Any]]:
    """The rows of a finished output, whichever format it was written in."""
    path = Path(out)
    if not path.exists():
        raise SourceError(f"no output at {out}")
    if path.is_dir():
        import datasets

        try:
            return list(datasets.load_from_disk(str(path)).to_list())
        except FileNotFoundError as exc:
            raise SourceError(f"{out} is not a datasets folder: {exc}") from None
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise SourceError(f"{out}:{line_no}: not a JSON row ({exc})") from None
    return rows


def summary_path(out: str | Path) -> Path:
    """``OUT.summary.json``, beside the output (a folder's sits next to the folder)."""
    path = Path(out)
    return path.with_name(path.name + ".summary.json")


def write_summary(out: str | Path, stats: Mapping[str, Any], job: Mapping[str, Any]) -> Path:
    """Write the job's summary (``stats``, plus ``job``: what was run) beside ``out``."""
    target = summary_path(out)
    document = {
        "output": str(out),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job": dict(job),
        "stats": dict(stats),
    }
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, target)
    return target


def read_summary(out: str | Path) -> dict[str, Any] | None:
    """The summary written beside ``out``, or None if there is none."""
    path = summary_path(out)
    if not path.is_file():
        return None
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else None
