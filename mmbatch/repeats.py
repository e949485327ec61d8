"""Identical requests answered once: a repeat waits for its first asking's answer.

A dataset that asks the same question of the same picture more than once (a row repeated,
two files with the same bytes) would otherwise pay the whole decode again for every repeat:
vLLM's prefix and encoder caches spare the prompt, not the answer. Where the answer is a
function of the request, one asking is enough:

* the request is what reaches the engine (``mmbatch.engine.vllm``'s ``_prompt`` and
  ``add``): its ``system``, ``prompt`` and ``history``, its media's content keys (bytes,
  modality and decode options, ``mmbatch.media.hashing.media_key``) and its effective
  ``Sampling``; never its ``id``, ``item_id``, ``output`` or ``columns``, which the engine
  does not see;
* the sampling is deterministic: greedy (``temperature == 0``, the product's default) or
  seeded (``seed`` set). Unseeded sampling (a temperature above 0, or ``None``, which hands
  the temperature to the model's ``generation_config``) makes each request its own draw:
  every one of them still goes to the engine, as the person asked for that many samples.

The pipeline asks ``Repeats`` before each ``engine.add``: a request whose answer is
remembered is answered at once; one whose identical request is in flight (its *leader*)
joins it as a *follower*, and gets a copy of the leader's answer when it comes back. Only
answers that are OK are shared: a leader that failed (refused, aborted, an engine error)
hands its followers back, never tried, for the engine to answer each on its own. A copy
is the answer the engine gave the leader; running the repeat again would give the same
text up to the engine's batch-to-batch numerical noise, which greedy decoding on a GPU
does not promise to be free of either.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mmbatch.types import LoadedRequest, Result, Sampling, Turn

RequestKey = tuple[str | None, str, tuple[Turn, ...], tuple[str, ...], Sampling]
"""What reaches the engine: system, prompt, history, media keys, effective sampling."""

REMEMBERED_ANSWERS = 4096
"""OK answers kept for repeats asked after their first asking finished (the least recently
used go first): a repeat planned far from its first asking, as two files with the same
bytes are (different planner groups). Each is kept for its own submission (a job, a
``Dataset.map`` batch) and forgotten with it: a later call asks the engine again, so that a
run meant to be the reference for another (the same request run alone) is one."""

Follower = TypeVar("Follower")
"""Whatever the caller needs to settle a follower later (its submission, its request)."""


def deterministic(sampling: Sampling) -> bool:
    """Whether ``sampling`` gives one answer however often a request is asked: greedy, or
    seeded. ``temperature=None`` leaves it to the model, which may sample: not counted."""
    return sampling.temperature == 0 or sampling.seed is not None


def request_key(loaded: LoadedRequest, sampling: Sampling) -> RequestKey | None:
    """The identity of ``loaded`` as the engine would see it under ``sampling`` (its
    effective sampling), or None where its answer is a draw of its own (unseeded sampling)
    and it must reach the engine whatever else is asked."""
    if not deterministic(sampling):
        return None
    asked = loaded.request
    return (asked.system, asked.prompt, asked.history, loaded.media_keys, sampling)


@dataclass
class _Leader(Generic[Follower]):
    key: RequestKey
    followers: list[Follower] = field(default_factory=list)


class Repeats(Generic[Follower]):
    """The leaders in flight (by engine id) with their followers, whatever submission each
    is of, and the OK answers of finished ones for the submission (``scope``) that asked
    them (at most ``remember`` in all, least recently used dropped first)."""

    def __init__(self, remember: int = REMEMBERED_ANSWERS) -> None:
        self.remember = remember
        self._leaders: dict[str, _Leader[Follower]] = {}
        self._leader_of: dict[RequestKey, str] = {}
        self._answers: OrderedDict[tuple[Hashable, RequestKey], Result] = OrderedDict()

    def answer(self, key: RequestKey, scope: Hashable) -> Result | None:
        """The OK answer to ``key`` remembered for ``scope`` (its leader's request id), if
        there is one."""
        result = self._answers.get((scope, key))
        if result is not None:
            self._answers.move_to_end((scope, key))
        return result

    def follow(self, key: RequestKey, follower: Follower) -> bool:
        """``follower`` waits for the leader of ``key`` in flight; False where none is."""
        engine_id = self._leader_of.get(key)
        if engine_id is None:
            return False
        self._leaders[engine_id].followers.append(follower)
        return True

    def lead(self, key: RequestKey, engine_id: str) -> None:
        """The request sent to the engine as ``engine_id`` answers ``key`` from now on."""
        if key in self._leader_of:
            raise RuntimeError(f"bug: {engine_id!r} leads a request already in flight")
        self._leaders[engine_id] = _Leader(key)
        self._leader_of[key] = engine_id

    def settle(self, engine_id: str, result: Result, scope: Hashable) -> list[Follower]:
        """``engine_id``'s ``result`` is back: its followers (none if it led none), whose
        answer it is if ``result.ok`` (then remembered for ``scope``, the leader's
        submission), and who go to the engine themselves if not."""
        leader = self._leaders.pop(engine_id, None)
        if leader is None:
            return []
        del self._leader_of[leader.key]
        if result.ok and self.remember > 0:
            self._answers[(scope, leader.key)] = result
            self._answers.move_to_end((scope, leader.key))
            while len(self._answers) > self.remember:
                self._answers.popitem(last=False)
        return leader.followers

    def forget(self, scope: Hashable) -> None:
        """Drop the answers remembered for ``scope`` (its submission is done)."""
        for remembered in [entry for entry in self._answers if entry[0] == scope]:
            del self._answers[remembered]

    def forget_in_flight(self) -> None:
        """Every leader is gone from the engine (the pipeline died): they and their
        followers, who will get no answer from here, are forgotten."""
        self._leaders.clear()
        self._leader_of.clear()

    def followers(self) -> list[Follower]:
        """Every follower waiting for a leader in flight."""
        return [f for leader in self._leaders.values() for f in leader.followers]

    @property
    def following(self) -> int:
        """Followers waiting for a leader in flight."""
        return sum(len(leader.followers) for leader in self._leaders.values())
