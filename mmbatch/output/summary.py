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
from mmbatch.output.paths import OutputPaths


def write_summary(paths: OutputPaths, stats: Mapping[str, Any], job: Mapping[str, Any]) -> Path:
    """Write the job's summary (``stats``, plus ``job``: what was run) beside the output."""
    target = paths.summary
    document = {
        "output": str(paths.rows),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job": dict(job),
        "stats": dict(stats),
    }
    write_text_atomic(target, json.dumps(document, indent=2, default=str) + "\n")
    return target


RUN_FIGURES = (
    "decodes",
    "answered_by_identical",
    "repeated_output_tokens",
    "wall_seconds",
    "items_per_second",
    "output_tokens_per_second",
    "prefix_cache_hit_rate",
    "mm_cache_hit_rate",
    "engine_queue",
    "engine_timeline",
    "startup_seconds",
    "process_seconds",
    "startup_phases",
)
"""What a run measures of itself (speed, caches, start-up), as opposed to the counts over
the whole output."""


def with_last_measured(paths: OutputPaths, stats: Mapping[str, Any]) -> dict[str, Any]:
    """``stats`` of a run that had nothing to do (a resume with 0 items left) with the
    figures of the last run that did, from the output's summary, and
    ``figures_from``: when that run finished. A rerun that only confirms the job is done
    would otherwise overwrite its speed with zeros."""
    try:
        previous = read_summary(paths)
    except (OSError, ValueError):
        previous = None
    if previous is None or not isinstance(previous.get("stats"), dict):
        return dict(stats)
    before = previous["stats"]
    kept = {name: before[name] for name in RUN_FIGURES if name in before}
    since = before.get("figures_from") or previous.get("finished_at")
    return {**stats, **kept, "figures_from": since}


def read_summary(paths: OutputPaths) -> dict[str, Any] | None:
    """The summary written beside the output, or None if there is none."""
    path = paths.summary
    if not path.is_file():
        return None
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else None
