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

from mmbatch.errors import FatalEngineError, RequestRejected
from mmbatch.types import CacheStats, Choice, LoadedRequest, MediaItem, Result, Sampling, Usage


def expected_text(media_keys: Sequence[str], prompt: str) -> str:
    return f"{'+'.join(media_keys)}|{prompt}"


class FakeEngine:
    """``step_seconds`` makes each step take that long (so a job lasts long enough to be
    killed mid-way); ``die_after_steps`` raises ``FatalEngineError`` on that step;
    ``engine_core`` starts a child process, as vLLM's engine does, and ``start_seconds``
    makes the start take that long after it, ``close_seconds`` its close (vLLM's teardown)."""

    def __init__(
        self,
        per_step: int = 3,
        reject_prompts: frozenset[str] = frozenset(),
        reject_in_step: bool = False,
        step_seconds: float = 0.0,
        die_after_steps: int | None = None,
        capacity: int = 64,
        crash_on_prompt: str | None = None,
        raise_on_prompt: str | None = None,
        drop_prompts: frozenset[str] = frozenset(),
        engine_core: bool = False,
        start_seconds: float = 0.0,
        close_seconds: float = 0.0,
    ) -> None:
        self.per_step = per_step
        self.reject_prompts = reject_prompts
        self.reject_in_step = reject_in_step  # refuse from step(), as a background renderer does
        self.step_seconds = step_seconds
        self.die_after_steps = die_after_steps
        self.max_in_flight = capacity
        self.crash_on_prompt = crash_on_prompt
        """A prompt that kills the whole process on arrival, as a segfault in a kernel would."""
        self.raise_on_prompt = raise_on_prompt
        """A prompt that makes every ``step`` raise while it is queued, as a vLLM bug would."""
        self.drop_prompts = drop_prompts
        """Prompts whose requests are forgotten on arrival, no result ever (a lost row)."""
        self._core = _start_engine_core() if engine_core else None
        """A process standing in for vLLM's engine core: started with the engine, in its
        process group, watching nothing, ended by ``close`` (as vLLM's shutdown ends its own)."""
        time.sleep(start_seconds)  # loading a model
        self.close_seconds = close_seconds
        self._poisoned: set[str] = set()
        self.steps = 0
        self.added: list[str] = []
        self.sampling: dict[str, Sampling] = {}
        """The sampling each added request came with, by request id."""
        self._queue: list[Result] = []

    def add(self, request: LoadedRequest, media: Sequence[MediaItem], sampling: Sampling) -> None:
        assert [m.key for m in media] == list(request.media_keys)
        if request.request.prompt == self.crash_on_prompt:
            os._exit(17)
        if request.request.prompt in self.reject_prompts:
            message = f"prompt {request.request.prompt!r} refused"
            if not self.reject_in_step:
                raise RequestRejected(message)
            self._queue.append(Result.failure(request.id, "validate", message))
            return
        self.added.append(request.id)
        if request.request.prompt in self.drop_prompts:
            return
        if request.request.prompt == self.raise_on_prompt:
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
        if self.die_after_steps is not None and self.steps > self.die_after_steps:
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
