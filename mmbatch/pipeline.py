"""Drive requests: windows -> loader -> planner -> engine -> one row per item, to a sink.

The engine is kept fed: while it works through the requests already added, a background
thread reads, hashes and decodes the next window, and that window is added as soon as the
engine's queue runs low. Results are matched to requests by id as they finish.

Every request ends as exactly one row, a result or an error; that invariant is checked at
the end (and a broken one is a bug, raised loudly). Per-item failures are rows; a fatal
engine error propagates after the rows finished so far are flushed to the sink.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from mmbatch import planner
from mmbatch.engine.base import Engine
from mmbatch.errors import ConfigError, RequestRejected
from mmbatch.media.loader import LoadedWindow, MediaLoader
from mmbatch.out.rows import FLAT, RowBuilder
from mmbatch.out.sinks import Sink
from mmbatch.out.stats import JobStats
from mmbatch.types import Request, Result, Sampling

DEFAULT_WINDOW = 512
"""Requests prepared (read, hashed, decoded, planned) together; large enough that repeated
media and shared prefixes land together, small enough to bound decoded pixels in memory."""


@dataclass(frozen=True)
class RunConfig:
    """How the pipeline drives the engine."""

    window: int = DEFAULT_WINDOW
    progress: bool = True

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ConfigError(f"window must be >= 1, got {self.window}")


def run_requests(
    requests: Sequence[Request],
    engine: Engine,
    loader: MediaLoader,
    sink: Sink,
    sampling: Sampling,
    run: RunConfig | None = None,
    rows: RowBuilder | None = None,
) -> JobStats:
    """Process every request through ``engine`` and write one row per item to ``sink``.

    An item is a request, or the requests sharing an ``item_id`` (assembled by ``rows``,
    by default ``FLAT``: one flat row per request)."""
    run = run or RunConfig()
    job = _Job(requests, engine, sink, rows or FLAT)
    low_water = max(1, run.window // 2)
    windows = _chunks(requests, run.window)
    bar = tqdm(total=job.stats.total, unit="item", disable=not run.progress, dynamic_ncols=True)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmbatch-load") as pool:
        upcoming: Future[LoadedWindow] | None = _load_next(pool, loader, windows)
        try:
            while True:
                busy = engine.num_unfinished()
                # Top up when the queue runs low, but never stall a busy engine on decoding.
                if upcoming is not None and busy < low_water and (upcoming.done() or not busy):
                    with job.stats.timed("load_wait"):
                        window = upcoming.result()
                    upcoming = _load_next(pool, loader, windows)
                    with job.stats.timed("add"):
                        job.add_window(window, sampling)
                elif busy:
                    with job.stats.timed("step"):
                        results = engine.step()
                    for result in results:
                        job.emit(result)
                elif upcoming is None:
                    break
                job.update_progress(bar)
        finally:
            if upcoming is not None:
                upcoming.cancel()
            bar.close()
            job.stats.decodes = loader.store.decodes
            job.stats.cache = engine.cache_stats()
    job.check_complete()
    job.stats.finished = time.perf_counter()
    return job.stats


class _Job:
    """The bookkeeping of one run: which requests are open, and the stats."""

    def __init__(
        self, requests: Sequence[Request], engine: Engine, sink: Sink, rows: RowBuilder
    ) -> None:
        self.engine = engine
        self.sink = sink
        self.rows = rows
        self.requests = {r.id: r for r in requests}
        if len(self.requests) != len(requests):
            raise ValueError("request ids must be unique")
        self.media_keys: dict[str, tuple[str, ...]] = {}
        self.emitted: set[str] = set()
        self.written = 0
        self.stats = JobStats(total=len({r.row_id for r in requests}))
        self._shown = 0

    def add_window(self, window: LoadedWindow, sampling: Sampling) -> None:
        # Once per window, the rows written so far are made durable (fsync): cheap at this
        # rate, and a power cut then costs at most about a window of rows, redone on resume.
        self.sink.flush()
        self.stats.bytes_read += window.bytes_read
        for failure in window.failures:
            self.emit(failure)
        for loaded in planner.ordered(window.requests):
            self.media_keys[loaded.id] = loaded.media_keys
            media = [window.media[key] for key in loaded.media_keys]
            try:
                self.engine.add(loaded, media, loaded.request.sampling or sampling)
            except RequestRejected as exc:
                self.emit(Result.failure(loaded.id, exc.stage, str(exc), exc.kind))

    def emit(self, result: Result) -> None:
        request_id = result.request_id
        if request_id in self.emitted:
            raise RuntimeError(f"bug: a second result for request {request_id!r}")
        request = self.requests[request_id]
        self.emitted.add(request_id)
        row = self.rows.add(request, self.media_keys.get(request_id, ()), result)
        if row is not None:
            self.written += 1
            self.stats.record(row.outcome)
            self.sink.write(row.data)

    def update_progress(self, bar: tqdm[Any]) -> None:
        done = self.stats.done
        if done == self._shown:
            return
        bar.update(done - self._shown)
        self._shown = done
        wall = self.stats.wall_seconds
        bar.set_postfix_str(
            f"{self.stats.output_tokens / wall:.0f} tok/s, {self.stats.failed} failed"
            if wall > 0
            else "",
            refresh=False,
        )

    def check_complete(self) -> None:
        missing = self.requests.keys() - self.emitted
        if missing:
            raise RuntimeError(
                f"bug: {len(missing)} requests produced no row, e.g. {min(missing)!r}"
            )
        if self.written != self.stats.total:
            raise RuntimeError(f"bug: {self.written} rows written for {self.stats.total} items")


def _chunks(requests: Sequence[Request], size: int) -> Iterator[Sequence[Request]]:
    start = 0
    while start < len(requests):
        end = min(start + size, len(requests))
        # An item's requests stay in one window: its media is read once and its questions
        # reach the engine together, sharing the prefix and the encoder output.
        while end < len(requests) and requests[end].row_id == requests[end - 1].row_id:
            end += 1
        yield requests[start:end]
        start = end


def _load_next(
    pool: ThreadPoolExecutor, loader: MediaLoader, windows: Iterator[Sequence[Request]]
) -> Future[LoadedWindow] | None:
    window = next(windows, None)
    return None if window is None else pool.submit(loader.load, window)
