"""An engine with no model: each request is done once its media are decoded.

``mmbatch frames VIDEO --save-frames DIR`` without ``--model`` extracts frames: the loader
decodes the sampled frames (and writes them to DIR as it does for a captioning job), and this
engine then answers each request at once with no text. Everything else is the job as usual:
resume, error rows for frames that do not decode, the summary. No vLLM is started.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmbatch.errors import FatalEngineError
from mmbatch.types import CacheStats, LoadedRequest, MediaItem, Restarts, Result, Sampling

DECODE_ONLY_CAPACITY = 256
"""Requests in flight: enough to keep the decoders busy, few enough to bound held frames."""


class DecodeOnly:
    """The ``Engine`` of a job without a model."""

    def __init__(self) -> None:
        self._done: list[Result] = []

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        self._done.append(Result(request.id))

    def step(self) -> list[Result]:
        done, self._done = self._done, []
        return done

    def num_unfinished(self) -> int:
        return len(self._done)

    def abort(self, request_ids: Sequence[str]) -> None:
        dropped = set(request_ids)
        self._done = [r for r in self._done if r.request_id not in dropped]

    def capacity(self) -> int:
        """Requests cost nothing here once decoded: as many as the feeder gives."""
        return DECODE_ONLY_CAPACITY

    def queue_depths(self) -> tuple[int, int]:
        return 0, len(self._done)

    def cache_stats(self) -> CacheStats:
        return CacheStats()

    def restarts(self) -> Restarts:
        """No engine process, none restarted."""
        return Restarts()

    def prompt_limits(self) -> None:
        """No model, no limits."""


class NoEngine(DecodeOnly):
    """The engine of a job none of whose requests can run (each refused while listing, so
    each fails before the engine): nothing is started, and nothing may reach it."""

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        raise FatalEngineError(f"request {request.id!r} reached a job that started no engine")
