"""The job's tally of its Ray replicas: what each replica counts of its batches that their
rows do not say, when its engine was ready, its start-up moments, its restarts, its engines'
layout and cache counters, gathered for the driver's summary.

``ReplicaTally`` runs as a Ray actor (``ray_data.start_tally``), which each replica tells
before it returns a batch's rows. Nothing here imports ray: the tally and its figures are
plain Python, tested as such.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from mmbatch.clock import process_seconds
from mmbatch.integrations.replica_starts import ReplicaStarts
from mmbatch.output.stats import JobStats
from mmbatch.types import CacheStats, Restarts


@dataclass(frozen=True)
class ReplicaFigures:
    """What a replica counts of its batches that their rows do not say, and the driver's
    summary, counted off the rows, would otherwise report as 0 (the local runner counts
    them as it runs, ``JobStats``): requests answered with an identical request's answer
    (``mmbatch.repeats``) and their output tokens, which tok/s leaves out; media decoded
    and bytes read."""

    answered_by_identical: int = 0
    repeated_output_tokens: int = 0
    decodes: int = 0
    bytes_read: int = 0

    @classmethod
    def of(cls, stats: JobStats) -> ReplicaFigures:
        return cls(**{name: getattr(stats, name) for name in cls.names()})

    def __add__(self, other: ReplicaFigures) -> ReplicaFigures:
        return ReplicaFigures(
            **{name: getattr(self, name) + getattr(other, name) for name in self.names()}
        )

    def add_to(self, stats: JobStats) -> None:
        for name in self.names():
            setattr(stats, name, getattr(stats, name) + getattr(self, name))

    @classmethod
    def names(cls) -> list[str]:
        """The figures, each a ``JobStats`` field of the same name."""
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class Tallied:
    """What the replicas told the job's tally (``ReplicaTally``), as the driver's summary
    takes it; empty where no replica ran."""

    figures: ReplicaFigures = field(default_factory=ReplicaFigures)
    layouts: list[str] = field(default_factory=list)
    """Their engines' layouts."""
    ready_at: float | None = None
    """When the first replica's engine was ready, by the wall clock."""
    restarts: tuple[int, float] = (0, 0.0)
    """The replicas' restarts: how many, and their seconds."""
    engine_restarts: Restarts = field(default_factory=Restarts)
    """Their engines' restarts inside them (``ReplicaTally.engine_restarts``)."""
    cache: CacheStats = field(default_factory=CacheStats)
    """Their engines' cache counters, summed (``ReplicaTally.caches``)."""


class ReplicaTally:
    """The ``ReplicaFigures`` of a job's batches, as a Ray actor (``start_tally``) that each
    replica tells before it returns a batch's rows: once Ray has written every row, every
    batch is counted. A batch is named by its first item id (an item is in one batch): one
    that Ray runs again, its actor lost, replaces its figures rather than adding them
    twice."""

    def __init__(self) -> None:
        self._batches: dict[str, ReplicaFigures] = {}
        self._ready_at: float | None = None
        self._layouts: set[str] = set()
        self._moments: dict[str, dict[str, float]] = {}
        self._starts = ReplicaStarts()
        self._engines_restarted: dict[str, Restarts] = {}
        self._caches: dict[str, CacheStats] = {}

    def add(
        self,
        batch: str,
        figures: ReplicaFigures,
        ready_at: float | None = None,
        replica: str | None = None,
    ) -> None:
        """``figures`` of ``batch``, finished by ``replica`` (its actor id); ``ready_at``:
        when its replica's engine was ready (the wall clock), of which the first is when the
        job's work began."""
        self._batches[batch] = figures
        if ready_at is not None:
            self._ready_at = ready_at if self._ready_at is None else min(self._ready_at, ready_at)
        if replica is not None:
            self._starts.finished_batch(replica)

    def begin(self, replica: str, at: float, process: str) -> str | None:
        """A start of ``replica`` (``ReplicaStarts.begin``): None, or why it must not start."""
        return self._starts.begin(replica, at, process)

    def engine_ready(self, replica: str, at: float) -> None:
        self._starts.ready(replica, at)

    def restarts(self) -> tuple[int, float]:
        """The replicas' restarts and their seconds (``ReplicaStarts.restarts``)."""
        return self._starts.restarts()

    def engines_restarted(self, process: str, restarts: Restarts) -> None:
        """The restarts so far of the engines that the replica process ``process``
        (``NODE:PID``) runs (its ``Engine.restarts``, cumulative: the latest replaces the
        last)."""
        self._engines_restarted[process] = restarts

    def engine_restarts(self) -> Restarts:
        """The engines restarted inside the replicas, and their seconds, each over its
        replica's engines (one of a replica's two restarting holds half of it): as a share of
        one replica, which the driver spreads over the job's replicas (``count_restarts``)."""
        told = self._engines_restarted.values()
        count = sum(r.count for r in told)
        return Restarts(count, sum(r.seconds / max(1, r.engines) for r in told))

    def engine_caches(self, process: str, cache: CacheStats) -> None:
        """The cache counters so far of the engines that the replica process ``process``
        runs (its ``Engine.cache_stats``, cumulative: the latest replaces the last)."""
        self._caches[process] = cache

    def caches(self) -> CacheStats:
        """The replicas' engines' cache counters, summed: the job's hit rates, as a local
        job's engines count them."""
        told = self._caches.values()
        return CacheStats(*(sum(getattr(c, f.name) for c in told) for f in fields(CacheStats)))

    def ready_at(self) -> float | None:
        """When the first replica's engine was ready (None: none said)."""
        return self._ready_at

    def started(self, replica: str, moments: dict[str, float]) -> None:
        """The start-up moments ``replica`` has seen so far (``milestones_wall``); a
        restart's do not replace its first start's (the job's start-up). Its ``last_row``
        is left out: each batch is a job of its own in the replica, so that moment is the
        end of its first batch, which a reader of the job's start-up would take for the
        job's last row."""
        told = {name: at for name, at in moments.items() if name != "last_row"}
        self._moments[replica] = {**told, **self._moments.get(replica, {})}

    def startups(self) -> list[dict[str, float]]:
        """Each replica's start-up moments, the first started first."""
        return sorted(self._moments.values(), key=lambda m: m.get("started", 0.0))

    def laid_out(self, layout: str) -> None:
        """A replica's engines, as ``Layout.describe`` says them."""
        self._layouts.add(layout)

    def layouts(self) -> list[str]:
        return sorted(self._layouts)

    def total(self) -> ReplicaFigures:
        return sum(self._batches.values(), ReplicaFigures())


def startup_split(ready_at: float | None, started: float) -> tuple[float | None, float]:
    """The driver's start-up (seconds from its process's start to the first replica's engine
    ready; None: no engine was started) and when the work began on this process's
    ``perf_counter`` (``started``, the run's start, when no engine was), from ``ready_at``:
    the first replica's engine ready, by the wall clock. So that a Ray job's summary splits
    its time as a local job's does, instead of counting the engines' start as work."""
    if ready_at is None:
        return None, started
    since = max(0.0, time.time() - ready_at)  # a replica on a clock ahead: no time since
    now = time.perf_counter()
    startup = min(process_seconds(), max(0.0, process_seconds() - since))
    return startup, max(started, now - since)
