"""The summary every job writes beside its output, ``OUT.summary.json``: the counts over the
whole output, this run's throughput and cache hit rates, and what was run. ``mmbatch report``
shows it at the top of the gallery."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmbatch.jsonl import write_text_atomic


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
    write_text_atomic(target, json.dumps(document, indent=2, default=str) + "\n")
    return target


def read_summary(out: str | Path) -> dict[str, Any] | None:
    """The summary written beside ``out``, or None if there is none."""
    path = summary_path(out)
    if not path.is_file():
        return None
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else None
