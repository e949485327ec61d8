"""The summary every job writes beside its output, ``OUT.summary.json``: the counts over the
whole output, this run's throughput and cache hit rates, and what was run. ``mmbatch report``
shows it at the top of the gallery. ``JobReport`` is the same, as a face prints it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmbatch.jsonl import write_text_atomic
from mmbatch.output.paths import OutputPaths
from mmbatch.output.stats import JobStats, OutputTally, format_counts


def write_summary(
    paths: OutputPaths, stats: Mapping[str, Any], job: Mapping[str, Any], shown: str | None = None
) -> dict[str, Any]:
    """Write the job's summary (``stats``, plus ``job``: what was run) beside the output,
    named as ``shown`` (its URL in storage) or by its path; return it, as a JSON object
    (what ``--json`` prints)."""
    document = {
        "output": shown or str(paths.rows),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job": dict(job),
        "stats": dict(stats),
    }
    text = json.dumps(document, indent=2, default=str)
    write_text_atomic(paths.summary, text + "\n")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


RUN_FIGURES = (
    "decodes",
    "answered_by_identical",
    "repeated_output_tokens",
    "wall_seconds",
    "restarts",
    "restart_seconds",
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


def time_split(
    whole: float | None, startup: float | None, work: float | None, restarts: float = 0.0
) -> str | None:
    """``time: 50.2 s for the whole command: start-up 47.7 s, work 0.7 s, finishing 1.8 s``:
    the command's seconds (``whole``: from the process's start to the summary written), then
    its parts: ``startup`` to the engine ready, ``work`` (the run's rows), ``restarts``
    (engines started again during the run, ``JobStats.restart_seconds``; said where there
    were any), and what is left (the rows put in order, the output counted, the summary
    written). None where the job started no engine in this process (its work is then all a
    figure can say)."""
    if whole is None or startup is None or work is None:
        return None
    finishing = max(0.0, whole - startup - work - restarts)
    restarted = f", restarts {restarts:.1f} s" if restarts else ""
    return (
        f"time: {whole:.1f} s for the whole command: start-up {startup:.1f} s, "
        f"work {work:.1f} s{restarted}, finishing {finishing:.1f} s"
    )


@dataclass
class JobReport:
    """What a run did, and what the whole output now holds."""

    out: Path | str
    """The output, by its path or its URL."""
    total: int
    """The job's items."""
    kept: int
    """Items whose rows were already in the output, from earlier runs."""
    run: JobStats
    """This run's rows (nothing, when every item already had one)."""
    output: OutputTally
    """Every row of the job's items in the output, this run's and earlier ones'."""
    summary_path: Path | str
    notes: Sequence[str] = ()
    """What listing the inputs passed over or changed (``Job.notes``)."""
    startup_seconds: float | None = None
    """From the process's start to its engine ready (None: no engine was started)."""
    process_seconds: float = 0.0
    """From the process's start to the summary written."""
    model: bool = True
    """Whether a model answered (False: frames only extracted, ``DecodeOnly``)."""
    document: Mapping[str, Any] = field(default_factory=dict)
    """The summary as written to ``summary_path`` (``write_summary``)."""

    @property
    def failed(self) -> int:
        return self.output.failed

    def lines(self) -> list[str]:
        """The summary a face prints at the end of the job: the whole command's time first,
        then its parts, so that no figure of one part reads as the command's."""
        run = self.run
        timing = time_split(
            self.process_seconds, self.startup_seconds, run.wall_seconds, run.restart_seconds
        )
        lines = [self.run.summary(timing, self.model)] if self.run.total else []
        lines.append(self.headline())
        if self.output.quarantine is not None:
            kinds = format_counts(self.output.failed_by_kind)
            lines.append(f"failed inputs ({kinds}) listed in {self.output.quarantine}")
        return lines + [f"note: {note}" for note in self.notes]

    def headline(self) -> str:
        """The line of the summary that says what the output holds: all ``-q`` prints."""
        return (
            f"rows written to {self.out}: {self.output.ok} ok, {self.output.failed} failed; "
            f"summary in {self.summary_path}"
        )
