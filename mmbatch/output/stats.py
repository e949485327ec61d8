"""Counting outcomes: the numbers behind the progress bar, the summary and the exit code.

One counter, ``Tally``, counts outcomes (``Result``s: ok or failed, with stage, kind and
token counts), whichever way they come: as this run's rows are written (``JobStats``, which
adds time, decodes and cache counters), or read back from a whole output (``count_output``,
which also writes the quarantine file), so a resumed job's summary and exit code describe
the whole output, not only what this run added.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from mmbatch.jsonl import write_atomic
from mmbatch.output.rows import RowShape
from mmbatch.types import CacheStats, Restarts, Result
from mmbatch.words import agreeing, counted


@dataclass
class Tally:
    """Outcomes counted: ok, failed (by stage and by kind), and tokens."""

    ok: int = 0
    failed: int = 0
    failed_by_stage: Counter[str] = field(default_factory=Counter)
    failed_by_kind: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    def record(self, outcome: Result) -> None:
        if outcome.error is None:
            self.ok += 1
        else:
            self.failed += 1
            self.failed_by_stage[outcome.error.stage] += 1
            self.failed_by_kind[outcome.error.kind] += 1
        self.prompt_tokens += outcome.usage.prompt_tokens
        self.output_tokens += outcome.usage.output_tokens
        self.cached_tokens += outcome.usage.cached_tokens

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def counts(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failed": self.failed,
            "failed_by_stage": dict(self.failed_by_stage),
            "failed_by_kind": dict(self.failed_by_kind),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
        }


TIMELINE_SAMPLES = 720
"""The most queue samples a summary keeps (a sample a second: every one for 12 minutes)."""


class QueueSample(NamedTuple):
    """The engine's queues at ``at`` seconds into a run (``JobStats.sample_queue``)."""

    at: float
    running: int
    waiting: int
    backlog: int
    handed: int


@dataclass
class JobStats(Tally):
    """What one run did. ``record`` is called once per output row the run writes."""

    total: int = 0
    decodes: int = 0
    bytes_read: int = 0
    cache: CacheStats = field(default_factory=CacheStats)
    answered_by_identical: int = 0
    """Requests answered with the answer of an identical request (``mmbatch.repeats``)
    instead of being decoded again; their rows count among the others, with its text and
    usage."""
    repeated_output_tokens: int = 0
    """The output tokens of those answers: in the rows (and ``output_tokens``), but not
    decoded by this run, so not in its rate of output tokens."""
    queue: list[QueueSample] = field(default_factory=list)
    """The engine's queues sampled once a second: whether the engine was kept fed."""
    restarts: int = 0
    """Engines started again during the run, each after its process died."""
    restart_seconds: float = 0.0
    """What those restarts took of the run's time: their start-up (each from its process's
    start to its engine ready), over the job's engines (one of N replicas restarting holds
    1/N of them: ``count_restarts``). Start-up, not work: ``wall_seconds`` and the speed
    leave it out, as they leave out the job's own start-up."""
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None

    def sample_queue(self, running: int, waiting: int, backlog: int, handed: int = 0) -> None:
        """``running`` and ``waiting``: the engine's own queues; ``backlog``: this run's
        requests not yet handed to the engine; ``handed``: requests handed to it and not yet
        back (those beyond running and waiting are still being prepared or sent)."""
        at = time.perf_counter() - self.started
        self.queue.append(QueueSample(at, running, waiting, backlog, handed))

    def queue_summary(self) -> dict[str, float] | None:
        """Medians of the sampled queue, and the share of samples, of those taken while this
        run still had requests to give the engine, in which the engine was starved: nothing
        waiting and fewer running than the most it ran (a full batch with nothing waiting
        is busy, not starved: counted as starved, a job whose engine ran all it could would
        read as starved throughout)."""
        if not self.queue:
            return None
        running = sorted(q.running for q in self.queue)
        waiting = sorted(q.waiting for q in self.queue)
        feeding = [(q.running, q.waiting) for q in self.queue if q.backlog > 0]
        starved = sum(1 for r, w in feeding if w == 0 and r < running[-1])
        return {
            "samples": len(self.queue),
            "running_median": running[len(running) // 2],
            "running_max": running[-1],
            "waiting_median": waiting[len(waiting) // 2],
            "feeding_samples": len(feeding),
            "starved_samples": starved,
            "starved_share": round(starved / len(feeding), 3) if feeding else 0.0,
        }

    def queue_timeline(self, most: int = TIMELINE_SAMPLES) -> list[list[float]]:
        """The samples as ``[seconds, running, waiting, backlog, handed]``: when the engine
        filled, when the job had handed everything over, how long the tail ran. A long run
        keeps every k-th sample, at most ``most``."""
        every = max(1, -(-len(self.queue) // most))
        return [[round(q.at, 2), *q[1:]] for q in self.queue[::every]]

    def count_restarts(self, restarts: Restarts) -> None:
        """Count ``restarts`` (the run's engines' restarts, ``Engine.restarts``) as this
        run's: while one of N engines starts again, the other N-1 still work, so its seconds
        are 1/N of the run's seconds lost to it, whichever face ran the engines."""
        self.restarts += restarts.count
        self.restart_seconds += restarts.seconds / max(1, restarts.engines)

    @property
    def decoded_tokens(self) -> int:
        """Output tokens the engine decoded in this run: the rows' less the repeats'."""
        return self.output_tokens - self.repeated_output_tokens

    @property
    def wall_seconds(self) -> float:
        """The work's seconds: the run's, less its restarts' (``restart_seconds``)."""
        end = self.finished if self.finished is not None else time.perf_counter()
        return end - self.started - self.restart_seconds

    def summary(self, time_line: str | None = None, model: bool = True) -> str:
        """A few human lines for the end of a run. ``time_line``: how long the whole command
        took and its parts (``mmbatch.output.summary.time_split``), said before the speed of
        the work; None: the work's own seconds. ``model``: whether a model answered (without
        one, frames are only extracted: no tokens, no engine queue, no cache)."""
        wall = self.wall_seconds
        rate = self.done / wall if wall > 0 else 0.0
        tok_rate = self.decoded_tokens / wall if wall > 0 else 0.0
        lines = [
            f"{self.done} of {counted(self.total, 'item')}: {self.ok} ok, {self.failed} failed"
            + (f" ({_by_stage(self.failed_by_stage)})" if self.failed else ""),
        ]
        if model:
            lines.append(
                f"tokens: {self.prompt_tokens} prompt ({self.cached_tokens} from prefix cache), "
                f"{self.output_tokens} output"
            )
        lines.append(time_line or f"time: {wall:.1f} s of work")
        speed = f"{rate:.2f} items/s" + (f", {tok_rate:.1f} output tok/s" if model else "")
        lines.append(f"speed: {speed}, over the {wall:.1f} s of work")
        if self.decodes or self.bytes_read:  # counted where the media were loaded
            caches = (
                f"; cache hit rates: prefix {_pct(self.cache.prefix_hit_rate)}, "
                f"multimodal {_pct(self.cache.mm_hit_rate)}"
                if model
                else ""
            )
            lines.append(f"media: {self.decodes} decoded, {_size(self.bytes_read)} read{caches}")
        if self.restarts:
            lines.append(
                f"restarts: {counted(self.restarts, 'engine')} started again after "
                f"{agreeing(self.restarts, 'its', 'their')} process died: "
                f"{self.restart_seconds:.1f} s of start-up, left out of the work's time and speed"
            )
        if self.answered_by_identical:
            lines.append(
                f"repeats: {counted(self.answered_by_identical, 'request')} answered by an "
                f"identical request's answer, not decoded again ({self.repeated_output_tokens} "
                "of the output tokens, left out of tok/s)"
            )
        queue = self.queue_summary() if model else None
        if queue is not None:
            lines.append(_queue_line(queue))
        if self.failed:
            lines.insert(1, f"failures by kind: {format_counts(self.failed_by_kind)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            **self.counts(),
            "decodes": self.decodes,
            "answered_by_identical": self.answered_by_identical,
            "repeated_output_tokens": self.repeated_output_tokens,
            "wall_seconds": round(self.wall_seconds, 3),
            "restarts": self.restarts,
            "restart_seconds": round(self.restart_seconds, 3),
            "items_per_second": _rate(self.done, self.wall_seconds),
            "output_tokens_per_second": _rate(self.decoded_tokens, self.wall_seconds),
            "prefix_cache_hit_rate": self.cache.prefix_hit_rate,
            "mm_cache_hit_rate": self.cache.mm_hit_rate,
            "engine_queue": self.queue_summary(),
            "engine_timeline": self.queue_timeline(),
        }


@dataclass
class OutputTally(Tally):
    """The rows of a whole output that belong to a job's items, counted; ``quarantine`` is
    the file listing the failed ones (None when nothing failed)."""

    quarantine: Path | str | None = None


def count_output(
    rows: Iterable[Mapping[str, Any]], shape: RowShape, item_ids: set[str], quarantine: Path
) -> OutputTally:
    """Count the rows of ``item_ids`` among ``rows`` (an output read back) and write the
    ``quarantine`` file of their failures (removing a stale one when nothing failed)."""
    tally = OutputTally()
    failures: list[dict[str, Any]] = []
    for row in rows:
        outcome = shape.outcome(row)
        if outcome.request_id not in item_ids:
            continue
        tally.record(outcome)
        if outcome.error is not None:
            failures.append(
                {"id": outcome.request_id, "source": row.get("source"), **outcome.error.to_dict()}
            )
    if failures:
        write_atomic(quarantine, failures)
        tally.quarantine = quarantine
    elif quarantine.exists():
        quarantine.unlink()
    return tally


def _by_stage(counts: Counter[str]) -> str:
    return ", ".join(f"{n} at {stage}" for stage, n in sorted(counts.items()))


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 3) if seconds > 0 else 0.0


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def format_counts(counts: Counter[str]) -> str:
    """``3 corrupt, 1 empty``: most frequent first, ties by name."""
    ranked = sorted(counts.items(), key=lambda c: (-c[1], c[0]))
    return ", ".join(f"{n} {name}" for name, n in ranked)


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.0%}"


def _queue_line(queue: dict[str, float]) -> str:
    """The summary's line on the engine's queue (``JobStats.queue_summary``). Starved
    samples are counted, not given as a share: an engine often takes a whole job within its
    first sample or two, and "100% of 1" would read as an engine starved throughout."""
    starved = (
        f"; nothing waiting and below its fullest in {queue['starved_samples']:.0f} of the "
        f"{queue['feeding_samples']:.0f} samples taken while requests were still to be "
        "handed to it"
        if queue["feeding_samples"]
        else ""
    )
    return (
        f"engine queue ({queue['samples']:.0f} samples): running median "
        f"{queue['running_median']:.0f} (max {queue['running_max']:.0f}), waiting median "
        f"{queue['waiting_median']:.0f}{starved}"
    )
