"""The boundary between the pipeline and an inference engine.

An engine takes requests one at a time (so one bad request is refused alone, never taking
its neighbours down with it), advances in steps, and hands back finished ``Result``s keyed by
request id, in whatever order they finish. The pipeline never assumes output order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mmbatch.media.limits import PromptLimits
from mmbatch.types import CacheStats, LoadedRequest, MediaItem, Restarts, Result, Sampling


class Engine(Protocol):
    """What the pipeline needs from an inference engine."""

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        """Queue one request. A request unusable on its own is refused alone: either here,
        by raising ``RequestRejected``, or later, as a failure ``Result`` from ``step`` (an
        engine that prepares requests in the background finds out only then). Raise
        ``FatalEngineError`` if the engine cannot go on."""
        ...

    def step(self) -> list[Result]:
        """Advance the engine; return the requests that finished (or were refused) since."""
        ...

    def num_unfinished(self) -> int:
        """Requests added and not yet returned by ``step``."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Forget these requests: they return no result (their caller is gone)."""
        ...

    def capacity(self) -> int:
        """How many requests to keep in flight so that the engine never waits for work:
        what it runs at once, plus what it can take in while those run."""
        ...

    def queue_depths(self) -> tuple[int, int] | None:
        """The engine's own running and waiting requests now (None where it cannot say)."""
        ...

    def cache_stats(self) -> CacheStats:
        """Cumulative prefix and multimodal cache counters, as far as the engine reports them."""
        ...

    def restarts(self) -> Restarts:
        """Its engines started again so far after their process died, and their start-up's
        seconds (none for an engine that does not restart its own processes)."""
        ...

    def prompt_limits(self) -> PromptLimits | None:
        """The model's limits, for the loader to measure (and shrink) requests before they
        are added; None where the engine has none to tell."""
        ...
