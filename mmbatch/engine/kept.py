"""A job's side of a kept engine: ``connect_engine(NAME)``, an ``Engine`` whose requests run on
an engine that ``mmbatch engine start`` keeps alive in a process of its own.

A user who iterates (a prompt changed, a folder captioned again) pays vLLM's start-up once,
not once per job: the job connects to the engine's Unix socket (``mmbatch.engine.kept_folder``
says who may) in milliseconds, and nothing here imports vLLM or torch. The job decodes and
hashes its media as it does for an engine of its own, and sends each request with its
decoded media, keyed by content, as a job sends them to its engine processes
(``mmbatch.engine.replicas``): the engine's caches keep hitting across jobs.

Everything a job guarantees holds: its rows, resume, its grouping and sampling are the job's
own; the engine only answers. A job that dies (``kill -9`` included) closes its connection,
and the engine drops that job's requests and serves the next. A job whose settings need
another engine (another model, engine arguments that differ, more media per prompt than the
engine was started for) is refused in one line (``ConfigError``) before it writes anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from threading import Lock
from typing import TYPE_CHECKING, Any

from mmbatch.engine.kept_folder import EngineFiles
from mmbatch.errors import ConfigError, FatalEngineError, RequestRejected
from mmbatch.media.options import VideoOptions
from mmbatch.types import (
    CacheStats,
    LoadedRequest,
    MediaItem,
    Modality,
    Request,
    Restarts,
    Result,
    Sampling,
)

if TYPE_CHECKING:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.media.video import VideoIndex

STEP_WAIT = 0.05
"""Seconds ``step`` waits for the engine's results before it returns empty-handed."""


def connect_engine(
    name: str,
    config: EngineConfig | None = None,
    media_per_prompt: Mapping[Modality, int] | None = None,
) -> KeptEngine:
    """The kept engine ``name`` (``mmbatch engine start``), as an ``Engine`` for a job.
    ``config``: the engine settings the job asks for, checked against the engine's (another
    model, or an engine argument given with another value, is a ``ConfigError``; arguments
    the job leaves out are the engine's); ``media_per_prompt``: the most media of each kind
    one request of the job carries, which the engine must have been started to take."""
    files = EngineFiles.of(name)
    info = files.read_info()
    if info is None or not files.socket.exists():
        raise ConfigError(f"no kept engine {name!r} (start one: mmbatch engine start MODEL)")
    if not info.get("ready"):
        raise ConfigError(f"the kept engine {name!r} is still starting (its log: {files.log})")
    refused = refusal(info, config, media_per_prompt or {})
    if refused is not None:
        raise ConfigError(f"the kept engine {name!r} {refused}")
    try:
        conn = Client(str(files.socket), family="AF_UNIX", authkey=files.read_key())
        conn.send(("job",))
        welcome = conn.recv()
    except (OSError, EOFError) as exc:
        raise ConfigError(
            f"the kept engine {name!r} does not answer ({exc}); its log: {files.log}"
        ) from None
    return KeptEngine(name, conn, welcome, lambda: _limits_connection(files))


def refusal(
    info: Mapping[str, Any], config: EngineConfig | None, media: Mapping[Modality, int]
) -> str | None:
    """Why a job of ``config`` and ``media`` cannot run on the engine ``info`` describes
    (said after the engine's name), or None."""
    if config is not None:
        if _same_model(config.model) != _same_model(str(info["model"])):
            return f"runs {info['model']}, not {config.model}: start one for it"
        engine_kwargs: Mapping[str, Any] = info["engine_kwargs"]
        for key, value in sorted(config.engine_kwargs.items()):
            if engine_kwargs.get(key) != value:
                return (
                    f"was started with {key}={engine_kwargs.get(key)!r}, the job asks for "
                    f"{key}={value!r}: start an engine with the job's settings"
                )
        for setting in ("gpus", "engines_per_gpu"):
            asked = getattr(config, setting)
            if asked is not None and asked != info.get(setting):
                return f"was started with {setting}={info.get(setting)!r}, the job asks for {asked}"
        if config.batch_invariant and not info.get("batch_invariant"):
            return "was not started with batch-invariant decoding, which the job asks for"
    takes: Mapping[str, int] = info["media_per_prompt"]
    for modality, count in sorted(media.items()):
        if count > takes.get(modality, 0):
            return (
                f"takes {takes.get(modality, 0)} {modality} per prompt, the job sends "
                f"{count}: start it with --media-per-prompt {modality}={count}"
            )
    return None


def _same_model(model: str) -> str:
    path = os.path.expanduser(model)
    return os.path.realpath(path) if os.path.isdir(path) else model


class KeptEngine:
    """``Engine`` on a kept engine, through one connection (see the module docstring)."""

    def __init__(
        self,
        name: str,
        conn: Connection,
        welcome: tuple[Any, ...],
        limits_connection: Callable[[], Connection],
    ) -> None:
        _, details = welcome
        self.name = name
        self.config: EngineConfig = details["config"]
        self.layout: str = details["layout"]
        self._conn = conn
        self._capacity: int = details["capacity"]
        self._base_cache: CacheStats = details["cache"]
        self._cache = self._base_cache
        self._base_restarts: Restarts = details["restarts"]
        self._restarts: Restarts = self._base_restarts
        self._depths: tuple[int, int] = (0, 0)
        self._held: set[str] = set()
        limits = details["limits"]
        self._limits = None if limits is None else RemoteLimits(limits, limits_connection)

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        from mmbatch.engine.replicas import portable

        self._held.add(request.id)
        try:
            self._conn.send(("add", portable(request), list(media), sampling))
        except OSError as exc:
            raise FatalEngineError(f"the kept engine {self.name!r} is gone ({exc})") from None

    def step(self) -> list[Result]:
        results: list[Result] = []
        try:
            if self._conn.poll(STEP_WAIT if self._held else 0):
                while True:
                    results += self._receive(self._conn.recv())
                    if not self._conn.poll(0):
                        break
        except (EOFError, OSError):
            raise FatalEngineError(f"the kept engine {self.name!r} ended") from None
        return results

    def _receive(self, message: tuple[Any, ...]) -> list[Result]:
        if message[0] == "fatal":
            raise FatalEngineError(f"the kept engine {self.name!r}: {message[1]}")
        _, results, self._capacity, self._cache, self._restarts, self._depths, lost = message
        self._held.difference_update(lost)  # the engine holds none of these: the job says so
        done = [r for r in results if r.request_id in self._held]
        self._held.difference_update(r.request_id for r in done)
        return done

    def num_unfinished(self) -> int:
        return len(self._held)

    def abort(self, request_ids: Sequence[str]) -> None:
        ids = [i for i in request_ids if i in self._held]
        self._held.difference_update(ids)
        if ids:
            with suppress(OSError):  # gone: it holds nothing of this job's then
                self._conn.send(("abort", ids))

    def capacity(self) -> int:
        return max(1, self._capacity)

    def queue_depths(self) -> tuple[int, int] | None:
        return self._depths

    def cache_stats(self) -> CacheStats:
        """This connection's share of the engine's counters: what it counted since the job
        connected (other jobs at the same time count in it too)."""
        now, base = self._cache, self._base_cache
        return CacheStats(
            now.prefix_queries - base.prefix_queries,
            now.prefix_hits - base.prefix_hits,
            now.mm_queries - base.mm_queries,
            now.mm_hits - base.mm_hits,
        )

    def restarts(self) -> Restarts:
        """The engine's restarts since the job connected, as the server last told them: its
        engine processes restart in the server's process, and a job's summary counts the
        start-ups that came while it ran apart from its work, as it would its own engine's
        (other jobs at the same time count them too)."""
        return self._restarts.since(self._base_restarts)

    def prompt_limits(self) -> RemoteLimits | None:
        return self._limits

    def close(self) -> None:
        """Let go of the engine (it keeps running for the next job)."""
        self._conn.close()
        if self._limits is not None:
            self._limits.close()


def _limits_connection(files: EngineFiles) -> Connection:
    conn = Client(str(files.socket), family="AF_UNIX", authkey=files.read_key())
    conn.send(("limits",))
    return conn


@dataclass
class LimitsFacts:
    """What the engine's limits say that does not depend on a request: sent once."""

    audio_rate: int | None
    max_pixels: dict[str, int | None]


class RemoteLimits:
    """The kept engine's ``PromptLimits``: its fixed facts sent once; a video's clip fitted
    by asking the engine (on a connection of its own, one question at a time); a request's
    measure taken by the engine as the request is added (its refusal comes back as the
    request's failure, as the job would have written it)."""

    def __init__(self, facts: LimitsFacts, connect: Callable[[], Connection]) -> None:
        self._facts = facts
        self._connect = connect
        self._conn: Connection | None = None
        self._lock = Lock()

    @property
    def audio_rate(self) -> int | None:
        return self._facts.audio_rate

    def max_pixels(self, modality: Modality) -> int | None:
        return self._facts.max_pixels.get(modality)

    def fit_clip(self, request: Request, index: VideoIndex, options: VideoOptions) -> VideoOptions:
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            self._conn.send(("fit_clip", request, index, options))
            answer = self._conn.recv()
        if answer[0] == "rejected":
            _, message, kind = answer
            raise RequestRejected(message, kind)
        fitted: VideoOptions = answer[1]
        return fitted

    def check(self, request: Request, media: Sequence[MediaItem]) -> None:
        """Measured by the engine as the request is added (sending its media twice would
        cost more than the measure)."""

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
