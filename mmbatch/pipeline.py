"""Drive an engine: requests in, through the feeder, kept saturated, rows out.

One ``Pipeline`` serves one engine for as long as the process has work for it: a command's
whole job, or the batches of a ``Dataset.map`` and the blocks of a Ray replica one after the
other, so that neither the engine nor the decode workers start again, and (with submissions
that overlap) the engine does not drain between batches. Each ``submit`` plans its requests
over the whole submission (``mmbatch.planner``), hands them to the feeder, and returns a
``Submission`` to wait on; a driver thread adds ready requests to the engine, steps it and
routes each result, by id, to its submission's rows and sink.

The engine is kept saturated: while work remains, the requests in flight are topped up to
the engine's ``capacity`` (vLLM: ``max_num_seqs`` plus a prefill's worth), so its waiting
queue does not run dry; the first requests go in as soon as their own media are decoded.
The engine's running and waiting counts are sampled once a second into each submission's
stats, so the summary shows whether that held.

Under greedy or seeded sampling, a request identical to one in flight, or to one answered
earlier in its submission, is not sent again (``mmbatch.repeats``): it waits for that answer,
in flight like its leader, and gets it under its own id; a leader that fails sends its
followers to the engine.

Every request ends as exactly one result, checked when its submission finishes (a broken
invariant is a bug, raised loudly). Per-item failures are results; a fatal engine error
ends every open submission with that error, after the rows finished so far were written. So
does a request the engine lost (it holds fewer requests than are in flight): once the
others are out, rather than the job waiting for it forever. And a request the pipeline
itself lost (a bug in its own bookkeeping) ends its submission within a second or two,
naming it: a watchdog sees a submission that is not complete while none of its requests is
still to come from the feeder, in the engine, or waiting for an identical one.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm

from mmbatch import planner
from mmbatch.clock import milestone
from mmbatch.engine.base import Engine
from mmbatch.errors import (
    ConfigError,
    DecodersFailed,
    FatalEngineError,
    RequestRejected,
    StorageUnavailable,
)
from mmbatch.lifetime import KeptPerProcess
from mmbatch.media.feeder import Feeder, Ready
from mmbatch.media.options import MediaOptions
from mmbatch.output.rows import FLAT, RowBuilder
from mmbatch.output.sinks import MemorySink, Sink
from mmbatch.output.stats import JobStats
from mmbatch.repeats import Repeats, request_key
from mmbatch.types import LoadedRequest, MediaItem, Request, Restarts, Result, Sampling

IDLE_WAIT = 0.05
"""Seconds the driver waits for ready media when the engine has nothing to do."""
SAMPLE_SECONDS = 1.0
"""How often the engine's running and waiting counts are sampled."""
FLUSH_SECONDS = 2.0
"""How often written rows are made durable (fsync): a power cut costs at most this much."""
MAX_AUTO_WORKERS = 8
LOST_SHOWN = 5
"""Request ids a stalled submission's error names (then how many more)."""


@dataclass(frozen=True)
class RunConfig:
    """How the pipeline drives the engine."""

    progress: bool = True
    decode_workers: int | None = None
    """Processes decoding media; None: one per core beyond two (at most 8); 0: a thread of
    this process (what a machine with few cores does best)."""
    memory_budget: int | None = None
    """Bytes of media held at once (read, decoded, on their way to the engine); None: an
    eighth of the machine's memory, between 256 MiB and 16 GiB."""

    def __post_init__(self) -> None:
        if self.decode_workers is not None and self.decode_workers < 0:
            raise ConfigError(f"decode_workers must be >= 0, got {self.decode_workers}")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise ConfigError(f"memory_budget must be >= 1 byte, got {self.memory_budget}")

    def workers(self) -> int:
        if self.decode_workers is not None:
            return self.decode_workers
        return min(MAX_AUTO_WORKERS, max(0, (os.cpu_count() or 1) - 2))

    def budget(self) -> int:
        if self.memory_budget is not None:
            return self.memory_budget
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return min(16 * 1024**3, max(256 * 1024**2, total // 8))


class Submission:
    """Requests handed to a pipeline together: where their rows go, and when they are done."""

    def __init__(
        self,
        tag: int,
        requests: list[Request],
        sampling: Sampling,
        rows: RowBuilder,
        sink: Sink,
        options: MediaOptions,
        progress: bool,
    ) -> None:
        self.tag = tag
        self.requests = {r.id: r for r in requests}
        if len(self.requests) != len(requests):
            raise ValueError("request ids must be unique")
        self.order = requests
        self.sampling = sampling
        self.rows = rows
        self.sink = sink
        self.options = options
        self.progress = progress
        self.stats = JobStats(total=len({r.row_id for r in requests}))
        self.media_keys: dict[str, tuple[str, ...]] = {}
        self.emitted: set[str] = set()
        self.delivered = 0
        """Requests the feeder has handed over (ready for the engine, or failed)."""
        self.written = 0
        self.in_flight = 0
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._callbacks: list[Callable[[], object]] = []
        self._callbacks_lock = threading.Lock()
        self._bar: tqdm[Any] | None = None
        self._shown = 0
        self.answered = False
        """Whether the engine has finished any of these requests yet."""
        self.restarts_before = Restarts()
        """The engine's restarts as this submission began (``Engine.restarts``): the ones
        after it are its own, counted apart from its work as it ends."""
        self._bar_timed = False

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> JobStats:
        """Block until every request has its result; the stats, or the error that ended it."""
        while not self._done.wait(0.2):  # a timed wait keeps Ctrl-C responsive
            continue
        if self.error is not None:
            raise self.error
        return self.stats

    def on_done(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (on the driver thread) once this submission is done; at once if
        it is already (an event loop passes ``call_soon_threadsafe`` here)."""
        with self._callbacks_lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def emit(self, result: Result) -> None:
        request_id = result.request_id
        if request_id in self.emitted:
            raise RuntimeError(f"bug: a second result for request {request_id!r}")
        self.emitted.add(request_id)
        row = self.rows.add(self.requests[request_id], self.media_keys.get(request_id, ()), result)
        if row is not None:
            if not self.written:
                milestone("first_row")
            self.written += 1
            self.stats.record(row.outcome)
            self.sink.write(row.data)

    def complete(self) -> bool:
        return len(self.emitted) == len(self.requests)

    def finish(self, error: BaseException | None = None) -> None:
        if self.written:
            milestone("last_row")
        if error is None:
            missing = self.requests.keys() - self.emitted
            if missing:
                error = RuntimeError(
                    f"bug: {len(missing)} requests got no row, e.g. {min(missing)!r}"
                )
            elif self.written != self.stats.total:
                error = RuntimeError(f"bug: {self.written} rows for {self.stats.total} items")
        self.error = error
        self.stats.finished = time.perf_counter()
        if self._bar is not None:
            self.show_progress()
            self._bar.close()
        with self._callbacks_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def show_progress(self) -> None:
        if not self.progress:
            return
        if self._bar is None:
            self._bar = tqdm(total=self.stats.total, unit="item", dynamic_ncols=True)
        done = self.stats.done
        if self.answered and not self._bar_timed:
            # The engine's first answers come after its warm-up (compiling for the first
            # batch, 40 s on a CPU), which says nothing of its pace: the bar's clock, and so
            # its rate and ETA, start from here, with the rows done so far as its start.
            self._bar_timed = True
            self._bar.reset(total=self.stats.total)
            self._bar.initial = self._bar.n = self._bar.last_print_n = self._shown = done
        if done == self._shown:
            return
        self._bar.update(done - self._shown)
        self._shown = done
        wall = self.stats.wall_seconds
        if wall > 0:
            self._bar.set_postfix_str(
                f"{self.stats.decoded_tokens / wall:.0f} tok/s, {self.stats.failed} failed",
                refresh=False,
            )


@dataclass
class _Asked:
    """A loaded request on its way to the engine, with what it takes to send it: a follower
    of an identical request is sent itself if that one fails."""

    submission: Submission
    loaded: LoadedRequest
    media: list[MediaItem]

    @property
    def sampling(self) -> Sampling:
        """What the engine decodes it with: its own sampling, or its submission's."""
        return self.loaded.request.sampling or self.submission.sampling


def _emit_copy(asked: _Asked, answer: Result) -> None:
    """``asked``'s row is ``answer``, an identical request's: counted as a repeat, its
    output tokens as not decoded again."""
    stats = asked.submission.stats
    stats.answered_by_identical += 1
    stats.repeated_output_tokens += answer.usage.output_tokens
    asked.submission.emit(replace(answer, request_id=asked.loaded.id))


class Pipeline:
    """One engine, its feeder and a driver thread, serving submissions in turn."""

    def __init__(self, engine: Engine, run: RunConfig | None = None) -> None:
        run = run or RunConfig()
        self.engine = engine
        self.feeder = Feeder(
            engine.prompt_limits(),
            workers=run.workers(),
            budget=run.budget(),
            lookahead=engine.capacity(),
        )
        self._inbox: queue.SimpleQueue[Submission] = queue.SimpleQueue()
        self._open: dict[int, Submission] = {}
        self._in_flight: dict[str, tuple[Submission, LoadedRequest]] = {}
        self._sent_any = False
        self._repeats: Repeats[_Asked] = Repeats()
        self._tags = itertools.count()
        self._wake = threading.Event()
        self._closed = False
        self._losing = False  # the engine lost a request: nothing more goes in (``_check_lost``)
        self._dead: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next_sample = self._next_flush = time.perf_counter() + SAMPLE_SECONDS

    def submit(
        self,
        requests: list[Request],
        sampling: Sampling,
        options: MediaOptions | None = None,
        rows: RowBuilder | None = None,
        sink: Sink | None = None,
        progress: bool = False,
    ) -> Submission:
        """Queue ``requests``; their rows go to ``sink`` (default: kept in memory) as they
        finish. Safe to call from any thread."""
        submission = Submission(
            next(self._tags),
            requests,
            sampling,
            rows or FLAT,
            sink or MemorySink(),
            options or MediaOptions(),
            progress,
        )
        with self._lock:
            if self._dead is not None:
                raise FatalEngineError(f"the engine is gone: {self._dead}") from self._dead
            if self._closed:
                raise RuntimeError("the pipeline is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="mmbatch-driver", daemon=True
                )
                self._thread.start()
        self._inbox.put(submission)
        self._wake.set()
        return submission

    @property
    def closed(self) -> bool:
        return self._closed or self._dead is not None

    @property
    def busy(self) -> bool:
        return bool(self._open) or not self._inbox.empty()

    def close(self) -> None:
        """Stop the driver (after the step in progress) and the feeder; a submission still
        open ends with an error (its rows so far are written)."""
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        if self.busy:
            self._die(RuntimeError("the pipeline was closed before this work was done"))
        self.feeder.close()

    # -- the driver thread ---------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._closed:
                if not self._open and self._inbox.empty():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                self._tick()
        except BaseException as exc:
            self._die(exc)

    def _tick(self) -> None:
        self._accept()
        busy = self.engine.num_unfinished()
        room = self.engine.capacity() - busy
        if room > 0 and not self._losing:
            for ready in self.feeder.take(room, timeout=0 if busy else IDLE_WAIT):
                self._add(ready)
        if self.engine.num_unfinished():
            for result in self.engine.step():
                self._finish(result)
        self._check_lost()
        self._housekeeping()

    def _check_lost(self) -> None:
        """Fail loudly, soon, when a request sent to the engine can no longer get its result,
        instead of waiting for it forever: the engine holds fewer requests than are in
        flight. Which ones is known once it holds none, so nothing more is sent meanwhile and
        the rest finish (their rows are written); then the job stops, and a rerun redoes
        what the engine lost."""
        unfinished = self.engine.num_unfinished()
        if unfinished >= len(self._in_flight):
            return
        self._losing = True
        if unfinished:
            return
        lost = sorted(loaded.id for _, loaded in self._in_flight.values())
        raise FatalEngineError(
            f"bug: the engine holds no request, yet {len(lost)} sent to it got no result "
            f"(e.g. {lost[0]!r})"
        )

    def _accept(self) -> None:
        while not self._inbox.empty():
            submission = self._inbox.get()
            submission.restarts_before = self.engine.restarts()
            self._open[submission.tag] = submission
            if submission.order:
                plan = planner.plan(submission.order)
                self.feeder.add(submission.tag, submission.order, plan, submission.options)
            else:
                self._close_if_complete(submission)

    def _add(self, ready: Ready) -> None:
        submission = self._open[ready.tag]  # type: ignore[index]
        submission.delivered += len(ready.failures) + len(ready.loaded)
        for failure in ready.failures:
            submission.emit(failure)
        for loaded in ready.loaded:
            submission.media_keys[loaded.id] = loaded.media_keys
            media = [ready.media[key] for key in loaded.media_keys]
            self._ask(_Asked(submission, loaded, media))
        self._close_if_complete(submission)

    def _ask(self, asked: _Asked) -> None:
        """Answer ``asked`` with an identical request's answer (remembered, or on its way
        from the engine: ``mmbatch.repeats``), or send it to the engine."""
        key = request_key(asked.loaded, asked.sampling)
        if key is not None:
            answer = self._repeats.answer(key, asked.submission.tag)
            if answer is not None:
                self.feeder.done(asked.loaded)
                _emit_copy(asked, answer)
                return
            if self._repeats.follow(key, asked):
                asked.submission.in_flight += 1  # its media stay held until it is settled
                return
        engine_id = self._send(asked)
        if engine_id is not None and key is not None:
            self._repeats.lead(key, engine_id)

    def _send(self, asked: _Asked) -> str | None:
        """Add ``asked`` to the engine; its engine id, or None where the engine refused it
        (its row is then the refusal)."""
        submission, loaded = asked.submission, asked.loaded
        engine_id = f"{submission.tag}:{loaded.id}"
        request = replace(loaded.request, id=engine_id)
        try:
            self.engine.add(LoadedRequest(request, loaded.media_keys), asked.media, asked.sampling)
        except RequestRejected as exc:
            self.feeder.done(loaded)
            submission.emit(Result.failure(loaded.id, exc.stage, str(exc), exc.kind))
            return None
        if not self._sent_any:  # the start-up's end as a job sees it (a kept engine's too)
            milestone("first_request")
            self._sent_any = True
        self._in_flight[engine_id] = (submission, loaded)
        submission.in_flight += 1
        return engine_id

    def _finish(self, result: Result) -> None:
        submission, loaded = self._in_flight.pop(result.request_id)
        followers = self._repeats.settle(result.request_id, result, submission.tag)
        self._settle(submission, loaded)
        submission.emit(replace(result, request_id=loaded.id))
        touched = {submission.tag: submission}
        for follower in followers:
            touched[follower.submission.tag] = follower.submission
            if result.ok:
                self._settle(follower.submission, follower.loaded)
                _emit_copy(follower, result)
            else:
                # A failure is its leader's own (refused, aborted, an engine error): the
                # follower was never tried, and the engine answers it on its own.
                follower.submission.in_flight -= 1
                self._send(follower)
        for each in touched.values():
            self._close_if_complete(each)

    def _settle(self, submission: Submission, loaded: LoadedRequest) -> None:
        """``loaded`` has its answer: it is no longer in flight, and its media may go."""
        submission.in_flight -= 1
        submission.answered = True
        self.feeder.done(loaded)

    def _close_if_complete(self, submission: Submission) -> None:
        if submission.complete():
            self._close(submission)

    def _close(self, submission: Submission, error: BaseException | None = None) -> None:
        """``submission`` is over: complete, or ended by ``error`` (its rows so far written)."""
        del self._open[submission.tag]
        self._repeats.forget(submission.tag)
        submission.stats.decodes, submission.stats.bytes_read = self.feeder.counts(submission.tag)
        self.feeder.forget(submission.tag)
        submission.stats.cache = self.engine.cache_stats()
        submission.stats.count_restarts(self.engine.restarts().since(submission.restarts_before))
        submission.sink.flush()
        submission.finish(error)

    def _end_stalled(self) -> None:
        """The watchdog: a submission none of whose missing rows can still come (every
        request handed over by the feeder, none in the engine, none waiting for an
        identical one) would wait forever; it ends now, naming what was lost, its rows so
        far written, so that a rerun resumes. Asked of the engine and the repeats
        themselves, not of the counters the same bookkeeping keeps."""
        coming = {submission.tag for submission, _ in self._in_flight.values()}
        coming.update(follower.submission.tag for follower in self._repeats.followers())
        for submission in list(self._open.values()):
            if submission.tag in coming or submission.delivered < len(submission.requests):
                continue
            lost = sorted(submission.requests.keys() - submission.emitted)
            if not lost:
                continue
            shown = ", ".join(map(repr, lost[:LOST_SHOWN]))
            more = f" and {len(lost) - LOST_SHOWN} more" if len(lost) > LOST_SHOWN else ""
            self._close(
                submission,
                FatalEngineError(
                    f"bug: the pipeline lost {len(lost)} request(s), whose rows can no "
                    f"longer come: {shown}{more}"
                ),
            )

    def _housekeeping(self) -> None:
        now = time.perf_counter()
        if now >= self._next_sample:
            self._next_sample = now + SAMPLE_SECONDS
            self._end_stalled()
            depths = self.engine.queue_depths()
            for submission in self._open.values():
                if depths is not None:
                    backlog = len(submission.requests) - len(submission.emitted)
                    backlog -= submission.in_flight
                    submission.stats.sample_queue(*depths, backlog, len(self._in_flight))
                submission.show_progress()
        if now >= self._next_flush:
            self._next_flush = now + FLUSH_SECONDS
            for submission in self._open.values():
                submission.sink.flush()

    def _die(self, exc: BaseException) -> None:
        with self._lock:
            self._dead = exc
        engine_dead = isinstance(exc, FatalEngineError) and not isinstance(
            exc, (DecodersFailed, StorageUnavailable)
        )
        if self._in_flight and not engine_dead:
            # The engine lives on (a shared one serves the next caller): what this pipeline
            # left in it would come back to nobody.
            self.engine.abort(list(self._in_flight))
            self._in_flight.clear()
        # Their leaders' answers will not come: the followers end with their submissions.
        self._repeats.forget_in_flight()
        while not self._inbox.empty():
            self._accept()
        for submission in list(self._open.values()):
            self._repeats.forget(submission.tag)
            # What stopped the job is said; a sink that cannot flush now (its storage gone
            # with the rest) must not leave the submission waiting forever.
            with suppress(Exception):
                submission.sink.flush()
            submission.finish(exc)
        self._open.clear()


def run_requests(
    requests: list[Request],
    engine: Engine,
    options: MediaOptions,
    sink: Sink,
    sampling: Sampling,
    run: RunConfig | None = None,
    rows: RowBuilder | None = None,
) -> JobStats:
    """Run ``requests`` on ``engine`` through a pipeline of their own, one row per item to
    ``sink``; the pipeline stops when they are done (a job that is the process's work)."""
    run = run or RunConfig()
    pipeline = Pipeline(engine, run)
    try:
        submission = pipeline.submit(requests, sampling, options, rows, sink, run.progress)
        return submission.wait()
    finally:
        pipeline.close()


KEPT_PIPELINES = 4
"""Engines whose pipelines ``pipeline_for`` keeps running; the least recently used one
beyond these is stopped (its engine stays usable: a later call starts a new pipeline)."""

_PIPELINES = KeptPerProcess(OrderedDict[int, Pipeline]())
"""This process's pipelines by engine (``id``), least recently used first. A forked child's
copies have no driver threads: they would take submissions and never run them."""


def pipeline_for(engine: Engine, run: RunConfig | None = None) -> Pipeline:
    """This process's long-lived pipeline for ``engine``, started on first use and kept for
    the batches that follow (a ``Dataset.map``, a Ray replica): its feeder's workers and
    decoded media last across them, and batches submitted together keep the engine busy.
    ``run``'s decode workers and budget apply when the pipeline starts."""
    with _PIPELINES.locked() as pipelines:
        pipeline = pipelines.get(id(engine))
        if pipeline is None or pipeline.engine is not engine or pipeline.closed:
            pipeline = pipelines[id(engine)] = Pipeline(engine, run)
        pipelines.move_to_end(id(engine))
        idle = [key for key, kept in pipelines.items() if not kept.busy and kept is not pipeline]
        for key in idle[: max(0, len(pipelines) - KEPT_PIPELINES)]:
            pipelines.pop(key).close()
        return pipeline


def close_pipeline(engine: Engine) -> None:
    """Stop the pipeline kept for ``engine`` (its feeder's workers, its decoded media), if
    there is one: the engine is going away."""
    with _PIPELINES.locked() as pipelines:
        pipeline = pipelines.pop(id(engine), None)
    if pipeline is not None:
        pipeline.close()
