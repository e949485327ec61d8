"""The kept engine's own process: ``mmbatch engine start`` runs ``python -m
mmbatch.engine.kept_server SETTINGS``, detached, its output in ``NAME.log``.

It starts its engine as every face does (``builder.read_host``, then ``builder.start_engine``:
engine processes that restart a dead engine and isolate the request that killed it), then
listens on its owner-only Unix socket (``mmbatch.engine.kept_folder``) and serves the jobs
that connect (``mmbatch.engine.kept``), any number at a time, on the one engine: each job's
requests are named apart (``JOB/ID``), and its results go back to it alone. A job that is
gone (its connection closed, by its end or by ``kill -9``) has its requests aborted; the
engine goes on serving the others and the next. It stops on ``mmbatch engine stop`` or
SIGTERM, closing its engine and removing its socket, key and record.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from typing import Any

from mmbatch.engine import builder
from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.kept import LimitsFacts
from mmbatch.engine.kept_folder import EngineFiles
from mmbatch.errors import FatalEngineError, MmbatchError, RequestRejected
from mmbatch.media.limits import PromptLimits, failure_of
from mmbatch.types import (
    CacheStats,
    LoadedRequest,
    MediaItem,
    Modality,
    Restarts,
    Result,
    Sampling,
)

REPORT_SECONDS = 1.0
"""How often a job with requests in the engine hears of its counters, results or not."""
IDLE_WAIT = 0.5
"""Seconds the loop sleeps on an empty inbox before it looks for a stop again."""


def open_kept_engine(
    config: EngineConfig, media_per_prompt: dict[Modality, int]
) -> tuple[Engine, str]:
    """The engine a kept engine serves, started as every engine is (``builder``), laid out
    for jobs of unknown size; and its layout, said."""
    host = builder.read_host(config)
    layout = host.layout()
    return builder.start_engine(host, media_per_prompt, layout), layout.describe()


@dataclass
class _Job:
    """A connected job: its connection, and its requests in the engine (by engine id)."""

    number: int
    conn: Connection
    held: set[str] = field(default_factory=set)
    results: list[Result] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


@dataclass
class _Shared:
    """What the greeting threads read of the engine, written by the serving loop."""

    config: EngineConfig
    layout: str
    limits: PromptLimits | None
    capacity: int = 1
    cache: CacheStats = field(default_factory=CacheStats)
    restarts: Restarts = field(default_factory=Restarts)
    """The engine's restarts so far: a job takes them as it joins, and since then as its own."""
    limits_lock: threading.Lock = field(default_factory=threading.Lock)
    """The limits' tokenizer is not to be used by two threads at once."""


def main(argv: Sequence[str]) -> int:
    settings = json.loads(argv[0])
    files = EngineFiles.of(settings["name"])
    config = EngineConfig(
        settings["model"],
        settings["engine_kwargs"],
        None,  # vLLM's log: this process's output, which is the engine's log file
        gpus=settings["gpus"],
        engines_per_gpu=settings["engines_per_gpu"],
        batch_invariant=settings["batch_invariant"],
    )
    media: dict[Modality, int] = settings["media_per_prompt"]
    record = {
        "name": files.name,
        "model": config.model,
        "engine_kwargs": config.llm_kwargs(),
        "gpus": config.gpus,
        "engines_per_gpu": config.engines_per_gpu,
        "batch_invariant": config.batch_invariant,
        "media_per_prompt": media,
        "pid": os.getpid(),
        "started": time.time(),
        "ready": False,
    }
    files.write_info(record)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    engine: Engine | None = None
    try:
        engine, layout = open_kept_engine(config, media)
        secret = files.new_key()
        old = os.umask(0o177)  # the socket is made owner-only, never briefly open
        try:
            listener = Listener(str(files.socket), family="AF_UNIX", authkey=secret)
        finally:
            os.umask(old)
        os.chmod(files.socket, 0o600)
        shared = _Shared(
            config, layout, engine.prompt_limits(), engine.capacity(), restarts=engine.restarts()
        )
        files.write_info({**record, "ready": True, "layout": layout})
        print(f"mmbatch: engine {files.name} ready: {layout}", file=sys.stderr, flush=True)
        serve(engine, listener, shared, stop)
        return 0
    except MmbatchError as exc:  # says why already: ``engine start`` shows this line
        print(f"mmbatch: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        print(f"mmbatch: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        files.remove()
        if engine is not None:
            getattr(engine, "close", lambda: None)()


def serve(engine: Engine, listener: Listener, shared: _Shared, stop: threading.Event) -> None:
    """Serve the jobs that connect until ``stop`` is set (or a job asks it to stop)."""
    inbox: queue.SimpleQueue[tuple[_Job | None, tuple[Any, ...]]] = queue.SimpleQueue()
    threading.Thread(target=_accept, args=(listener, shared, inbox), daemon=True).start()
    jobs: dict[int, _Job] = {}
    last_report = 0.0
    try:
        while not stop.is_set():
            idle = not engine.num_unfinished()
            try:
                item: tuple[_Job | None, tuple[Any, ...]] | None = inbox.get(
                    timeout=IDLE_WAIT if idle else 0
                )
            except queue.Empty:
                item = None
            while item is not None:
                job, message = item
                if job is None:  # a stop, asked on a connection of its own
                    return
                _take(engine, jobs, job, message, shared)
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    item = None
            try:
                results = engine.step() if engine.num_unfinished() else []
            except FatalEngineError as exc:
                for job in jobs.values():
                    _send(job, ("fatal", str(exc)))
                raise
            _route(results, jobs, lost=not engine.num_unfinished())
            # Every turn, not only when a job is told: a job joining takes them as its base.
            shared.restarts = engine.restarts()
            now = time.monotonic()
            due = now - last_report > REPORT_SECONDS
            if due:
                last_report = now
            telling = [j for j in jobs.values() if j.results or j.lost or (due and j.held)]
            if telling:  # the counters as they are now: a job's summary ends with them
                shared.capacity, shared.cache = engine.capacity(), engine.cache_stats()
            depths = engine.queue_depths() or (0, 0)
            for job in telling:
                done, job.results = job.results, []
                lost, job.lost = job.lost, []
                message = (
                    "results",
                    done,
                    shared.capacity,
                    shared.cache,
                    shared.restarts,
                    depths,
                    lost,
                )
                if not _send(job, message):
                    _forget(engine, jobs, job)
    finally:
        listener.close()


def _take(
    engine: Engine, jobs: dict[int, _Job], job: _Job, message: tuple[Any, ...], shared: _Shared
) -> None:
    kind = message[0]
    if kind == "joined":
        jobs[job.number] = job
    elif kind == "add":
        _, request, media, sampling = message
        _add(engine, job, request, media, sampling, shared)
    elif kind == "abort":
        ids = [f"{job.number}/{i}" for i in message[1]]
        engine.abort([i for i in ids if i in job.held])
        job.held.difference_update(ids)
    elif kind == "gone":
        _forget(engine, jobs, job)


def _add(
    engine: Engine,
    job: _Job,
    request: LoadedRequest,
    media: Sequence[MediaItem],
    sampling: Sampling,
    shared: _Shared,
) -> None:
    """Add the job's request under its engine id, measured first as the job would have
    measured it (``failure_of``): a refusal is the request's failure, for the job alone."""
    engine_id = f"{job.number}/{request.id}"
    named = LoadedRequest(replace(request.request, id=engine_id), request.media_keys)
    job.held.add(engine_id)
    decoded = dict(zip(named.media_keys, media, strict=True))
    with shared.limits_lock:
        failure = failure_of(named, decoded, {}, shared.limits)
    if failure is None:
        try:
            engine.add(named, media, sampling)
            return
        except RequestRejected as exc:
            failure = Result.failure(engine_id, exc.stage, str(exc), exc.kind)
    _route([failure], {job.number: job}, lost=False)


def _route(results: list[Result], jobs: dict[int, _Job], lost: bool) -> None:
    """Each result to its job, under the job's own id; with ``lost`` (the engine holds
    nothing), what a job still waits for is lost, and it is told so."""
    for result in results:
        number, _, own_id = result.request_id.partition("/")
        job = jobs.get(int(number))
        if job is not None and result.request_id in job.held:
            job.held.discard(result.request_id)
            job.results.append(replace(result, request_id=own_id))
    if lost:
        for job in jobs.values():
            if job.held:
                job.lost += [i.partition("/")[2] for i in sorted(job.held)]
                job.held.clear()


def _forget(engine: Engine, jobs: dict[int, _Job], job: _Job) -> None:
    """The job is gone: its requests leave the engine, and it leaves the loop."""
    if job.held:
        engine.abort(sorted(job.held))
        job.held.clear()
    jobs.pop(job.number, None)
    job.conn.close()


def _send(job: _Job, message: tuple[Any, ...]) -> bool:
    try:
        job.conn.send(message)
    except OSError:
        return False
    return True


def _accept(
    listener: Listener,
    shared: _Shared,
    inbox: queue.SimpleQueue[tuple[_Job | None, tuple[Any, ...]]],
) -> None:
    number = 0
    while True:
        try:
            conn = listener.accept()
        except (AuthenticationError, EOFError, ConnectionError):
            continue  # a caller without the key, or one that left at once
        except OSError:
            return  # the listener closed: the engine stops
        number += 1
        greet = threading.Thread(target=_greet, args=(conn, number, shared, inbox), daemon=True)
        greet.start()


def _greet(
    conn: Connection,
    number: int,
    shared: _Shared,
    inbox: queue.SimpleQueue[tuple[_Job | None, tuple[Any, ...]]],
) -> None:
    """Read what the connection is for: a job (then its messages, until it is gone), the
    limits' questions, or a stop. The connection closing ends it: a job's end ("gone" was
    queued) or a client gone early."""
    with suppress(EOFError, OSError):
        hello = conn.recv()
        if hello[0] == "stop":
            inbox.put((None, ("stop",)))
            conn.send(("stopping",))
        elif hello[0] == "limits":
            _answer_limits(conn, shared)
        elif hello[0] == "job":
            job = _Job(number, conn)
            conn.send(("welcome", _welcome(shared)))
            inbox.put((job, ("joined",)))
            try:
                while True:
                    inbox.put((job, conn.recv()))
            finally:
                inbox.put((job, ("gone",)))


def _welcome(shared: _Shared) -> dict[str, Any]:
    limits = shared.limits
    facts = None
    if limits is not None:
        with shared.limits_lock:
            pixels: dict[str, int | None] = {m: limits.max_pixels(m) for m in ("image", "video")}
            facts = LimitsFacts(limits.audio_rate, pixels)
    return {
        "config": shared.config,
        "layout": shared.layout,
        "capacity": shared.capacity,
        "cache": shared.cache,
        "restarts": shared.restarts,
        "limits": facts,
    }


def _answer_limits(conn: Connection, shared: _Shared) -> None:
    while True:
        _, request, index, options = conn.recv()
        assert shared.limits is not None
        try:
            with shared.limits_lock:
                fitted = shared.limits.fit_clip(request, index, options)
            conn.send(("ok", fitted))
        except RequestRejected as exc:
            conn.send(("rejected", str(exc), exc.kind))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
