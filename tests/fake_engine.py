"""A deterministic stand-in for the engine, for fast tests of the pipeline's bookkeeping.

Its text is a function of the request's media keys and prompt only, so a test can tell
whether a row got the right caption (with ``Sampling.n`` > 1, the i-th completion ends in
``#i``). It finishes requests out of order on purpose (newest
first, a few per step) to catch any code that matches results by position.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mmbatch.errors import FatalEngineError, RequestRejected
from mmbatch.types import (
    CacheStats,
    Choice,
    LoadedRequest,
    MediaItem,
    Restarts,
    Result,
    Sampling,
    Usage,
)


def expected_text(media_keys: Sequence[str], prompt: str) -> str:
    return f"{'+'.join(media_keys)}|{prompt}"


@dataclass(frozen=True)
class Faults:
    """How the fake engine fails, each as a real engine can, for the tests of what survives
    it: nothing by default."""

    reject_prompts: frozenset[str] = frozenset()
    """Prompts whose requests are refused on arrival (``RequestRejected``)."""
    reject_in_step: bool = False
    """Refuse them from ``step`` instead, as a background renderer does."""
    die_after_steps: int | None = None
    """The steps run before every later one raises ``FatalEngineError`` (the engine died)."""
    crash_on_prompt: str | None = None
    """A prompt that kills the whole process on arrival, as a segfault in a kernel would."""
    raise_on_prompt: str | None = None
    """A prompt that makes every ``step`` raise while it is queued, as a vLLM bug would."""
    drop_prompts: frozenset[str] = frozenset()
    """Prompts whose requests are forgotten on arrival, no result ever (a lost row)."""


@dataclass(frozen=True)
class Lifecycle:
    """How the fake engine starts and ends, as vLLM's does: in no time, by default."""

    engine_core: bool = False
    """Start a child process standing in for vLLM's engine core: in the engine's process
    group, watching nothing, ended by ``close`` (as vLLM's shutdown ends its own)."""
    start_seconds: float = 0.0
    """How long the start takes (loading a model), after the engine core's."""
    close_seconds: float = 0.0
    """How long ``close`` takes (vLLM's teardown)."""


class FakeEngine:
    """``per_step`` requests finish at each step, newest first; ``capacity`` is how many it
    holds at once; ``step_seconds`` makes each step take that long (so a job lasts long
    enough to be killed mid-way). ``faults`` says how it fails, ``lifecycle`` how it starts
    and ends."""

    def __init__(
        self,
        per_step: int = 3,
        capacity: int = 64,
        step_seconds: float = 0.0,
        faults: Faults | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.per_step = per_step
        self.max_in_flight = capacity
        self.step_seconds = step_seconds
        self.faults = faults = faults or Faults()
        lifecycle = lifecycle or Lifecycle()
        self._core = _start_engine_core() if lifecycle.engine_core else None
        time.sleep(lifecycle.start_seconds)  # loading a model
        self.close_seconds = lifecycle.close_seconds
        self._poisoned: set[str] = set()
        self.steps = 0
        self.added: list[str] = []
        self.sampling: dict[str, Sampling] = {}
        """The sampling each added request came with, by request id."""
        self._queue: list[Result] = []

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        assert [m.key for m in media] == list(request.media_keys)
        faults = self.faults
        if request.request.prompt == faults.crash_on_prompt:
            os._exit(17)
        if request.request.prompt in faults.reject_prompts:
            message = f"prompt {request.request.prompt!r} refused"
            if not faults.reject_in_step:
                raise RequestRejected(message)
            self._queue.append(Result.failure(request.id, "validate", message))
            return
        self.added.append(request.id)
        if request.request.prompt in faults.drop_prompts:
            return
        if request.request.prompt == faults.raise_on_prompt:
            self._poisoned.add(request.id)
        text = expected_text(request.media_keys, request.request.prompt)
        texts = [f"{text}#{i}" for i in range(sampling.n)] if sampling.n > 1 else [text]
        choices = tuple(Choice(t, "stop", len(t)) for t in texts) if sampling.n > 1 else ()
        usage = Usage(prompt_tokens=10, output_tokens=sum(map(len, texts)))
        text = texts[0]
        self.sampling[request.id] = sampling
        self._queue.append(Result(request.id, text, "stop", usage, choices=choices))

    def step(self) -> list[Result]:
        self.steps += 1
        dies_after = self.faults.die_after_steps
        if dies_after is not None and self.steps > dies_after:
            raise FatalEngineError("the fake engine died")
        if self._poisoned & {r.request_id for r in self._queue}:
            raise RuntimeError("the fake engine's step failed on a poisoned request")
        if self.step_seconds:
            time.sleep(self.step_seconds)
        done, self._queue = self._queue[-self.per_step :], self._queue[: -self.per_step]
        return done[::-1]

    def num_unfinished(self) -> int:
        return len(self._queue)

    def abort(self, request_ids: Sequence[str]) -> None:
        dropped = set(request_ids)
        self._queue = [r for r in self._queue if r.request_id not in dropped]

    def capacity(self) -> int:
        return self.max_in_flight

    def queue_depths(self) -> tuple[int, int]:
        running = min(len(self._queue), self.per_step)
        return running, len(self._queue) - running

    def cache_stats(self) -> CacheStats:
        return CacheStats()

    def restarts(self) -> Restarts:
        """It runs in the process that made it: nothing of its own to restart."""
        return Restarts()

    def prompt_limits(self) -> None:
        """The fake engine has no model, hence no limits."""

    def close(self) -> None:
        """End the stand-in for vLLM's engine core, if there is one."""
        time.sleep(self.close_seconds)
        core, self._core = self._core, None
        if core is not None:
            core.kill()
            core.wait()


def _start_engine_core() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
