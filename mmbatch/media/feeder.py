"""Stream a planned job's media to the engine: read and hash ahead on threads, decode on
worker processes, hold no more than a byte budget.

The plan says which requests go together (``mmbatch.planner``); the feeder walks it from the
front, a *unit* at a time (a group, or a stretch of a long one such as a video's frames),
and for each unit

1. keys it on a reader thread (``Keyer``: read, hash; I/O and xxhash, which leave the GIL),
2. decodes the items not already held on the decode pool (``decode``; processes, since
   decoding and resizing hold the GIL where it matters), each distinct key once even when
   several units want it at the same time,
3. measures each request against the model's limits, and puts the unit on the ready queue,
   merged into a ready unit that turned out to use the very same media.

The pipeline ``take``s ready units as the engine has room and reports each request it is
``done`` with, so that its media can be dropped. Reading stops while the units on their way
hold more than ``lookahead`` requests or the media held (raw bytes waiting to be decoded,
decoded items in use or kept for repeats) pass ``budget`` bytes; at least one unit is
always on its way, so a single item larger than the budget still goes through.

All the bookkeeping happens on one coordinator thread, fed by an event queue; the pools'
callbacks and the pipeline only post events, so no state is shared but the ready queue.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from mmbatch.errors import FatalEngineError
from mmbatch.media.decode import Decoded, DecodeJob
from mmbatch.media.decoders import Decoders
from mmbatch.media.keys import KeyedUnit, Keyer
from mmbatch.media.limits import PromptLimits, failure_of, settle
from mmbatch.media.options import MediaOptions
from mmbatch.media.store import MediaStore
from mmbatch.planner import Plan
from mmbatch.types import ItemError, LoadedRequest, MediaItem, Request, Result

UNIT_REQUESTS = 16
"""Requests per unit at most: a video's frames are decoded a stretch at a time, each
stretch in one pass, so the first frames reach the engine before the last are decoded
(with larger units, a job of a few videos keeps the GPU waiting for each one's first
unit)."""
READERS = 4
"""Reader threads: enough to overlap file reads with hashing on local and network disks."""


@dataclass
class Ready:
    """A unit whose media are decoded: requests for the engine, and requests that failed."""

    tag: Hashable
    loaded: list[LoadedRequest] = field(default_factory=list)
    media: dict[str, MediaItem] = field(default_factory=dict)
    failures: list[Result] = field(default_factory=list)


@dataclass
class _Unit:
    tag: Hashable
    requests: list[Request]
    keyer: Keyer
    keyed: KeyedUnit | None = None
    waiting: set[str] = field(default_factory=set)
    """Keys not decoded yet."""


@dataclass
class _Work:
    tag: Hashable
    requests: Sequence[Request]
    plan: Plan
    keyer: Keyer
    next_group: int = 0
    backlog: list[list[Request]] = field(default_factory=list)
    """Units cut from the current group and not started yet."""


class Feeder:
    """Reads, hashes and decodes the media of planned requests ahead of the engine."""

    def __init__(
        self, limits: PromptLimits | None, *, workers: int, budget: int, lookahead: int
    ) -> None:
        self.limits = limits
        self.store = MediaStore(budget)
        self.budget = budget
        self.lookahead = lookahead
        self.workers = workers
        self._counts: dict[Hashable, list[int]] = {}  # tag -> [decodes, bytes read]
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._work: deque[_Work] = deque()
        self._queued = 0  # requests in units started and not yet taken
        self._preparing = 0  # units read or decoded now: their decoded bytes are not known yet
        self.preparing_cap = 2 * READERS + 2 * max(1, workers)
        """Units in preparation at once: enough to keep readers and decoders busy; the budget
        can be passed by at most this many units' media."""
        self._raw = 0  # bytes read and waiting for their decode
        self.peak_bytes = 0
        """The most media bytes held at once (read and waiting, decoded and kept)."""
        self._decoding: dict[str, list[_Unit]] = {}  # key -> units waiting for it
        self._errors: dict[str, ItemError] = {}
        self._ready: deque[Ready] = deque()
        self._ready_by_media: dict[frozenset[str], Ready] = {}
        self._cond = threading.Condition()
        self._crash: BaseException | None = None
        self._closed = False
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="mmbatch-read")
        self._decoders = Decoders(workers)
        self._thread = threading.Thread(target=self._coordinate, name="mmbatch-feeder", daemon=True)
        self._thread.start()

    # -- the pipeline's side -------------------------------------------------------------

    def add(
        self, tag: Hashable, requests: Sequence[Request], plan: Plan, options: MediaOptions
    ) -> None:
        """Queue ``requests`` (planned by ``plan``, their media decoded with ``options``)
        under ``tag``, after the work queued before."""
        keyer = Keyer(settle(options, self.limits), self.limits)
        self._events.put(("add", _Work(tag, requests, plan, keyer)))

    def take(self, max_requests: int, timeout: float) -> list[Ready]:
        """Ready units, holding up to about ``max_requests`` requests for the engine (at
        least one unit when any is ready); waits up to ``timeout`` s for the first."""
        with self._cond:
            if not self._ready and self._crash is None:
                self._cond.wait(timeout)
            if isinstance(self._crash, FatalEngineError):
                raise self._crash
            if self._crash is not None:
                raise RuntimeError("the media feeder stopped") from self._crash
            taken: list[Ready] = []
            count = 0
            while self._ready and (not taken or count + len(self._ready[0].loaded) <= max_requests):
                unit = self._ready.popleft()
                self._ready_by_media.pop(_media_of(unit), None)
                taken.append(unit)
                count += len(unit.loaded)
        if taken:
            self._events.put(("taken", sum(len(u.loaded) + len(u.failures) for u in taken)))
        return taken

    def done(self, loaded: LoadedRequest) -> None:
        """The engine is done with ``loaded``: its media may go."""
        for key in loaded.media_keys:
            self.store.unpin(key)
        self._events.put(("room", None))

    def close(self) -> None:
        self._events.put(("close", None))
        self._thread.join(timeout=10)
        self._readers.shutdown(wait=False, cancel_futures=True)
        self._decoders.close()

    def counts(self, tag: Hashable) -> tuple[int, int]:
        """Items decoded and bytes read for the work queued under ``tag`` so far."""
        decodes, bytes_read = self._counts.get(tag, (0, 0))
        return decodes, bytes_read

    def forget(self, tag: Hashable) -> None:
        """``tag``'s work is done: drop its counts."""
        self._events.put(("forget", tag))

    # -- the coordinator ----------------------------------------------------------------

    def _post(self, kind: str, subject: object, future: Future[Any]) -> None:
        """A pool's done-callback: hand the finished ``future`` to the coordinator."""
        self._events.put((kind, (subject, future)))

    def _coordinate(self) -> None:
        try:
            while True:
                self._start_units()
                kind, payload = self._events.get()
                if kind == "close":
                    return
                if kind == "add":
                    self._work.append(payload)
                    self._counts[payload.tag] = [0, 0]
                elif kind == "forget":
                    self._counts.pop(payload, None)
                elif kind == "taken":
                    self._queued -= payload
                elif kind == "keyed":
                    self._keyed(*payload)
                elif kind == "decoded":
                    self._decoded(*payload)
        except BaseException as exc:  # a bug here must not leave the pipeline waiting
            with self._cond:
                self._crash = exc
                self._cond.notify_all()
            if not isinstance(exc, FatalEngineError):  # that one is the job's to say
                raise

    def _start_units(self) -> None:
        while self._has_room():
            requests = self._next_unit()
            if requests is None:
                return
            work = self._work[0]
            unit = _Unit(work.tag, requests, work.keyer)
            self._queued += len(requests)
            self._preparing += 1
            future = self._readers.submit(unit.keyer.key, requests)
            future.add_done_callback(partial(self._post, "keyed", unit))

    def _has_room(self) -> bool:
        held = self._raw + self.store.held_bytes
        self.peak_bytes = max(self.peak_bytes, held)
        if self._queued == 0:
            return True  # always one unit on its way, however large
        if self._preparing >= self.preparing_cap:
            return False  # their bytes are not counted yet: only so many at a time
        return self._queued < self.lookahead and held < self.budget

    def _next_unit(self) -> list[Request] | None:
        while self._work:
            work = self._work[0]
            if work.backlog:
                return work.backlog.pop(0)
            if work.next_group < len(work.plan):
                group = work.plan.group(work.next_group)
                work.next_group += 1
                members = [work.requests[i] for i in group]
                work.backlog = [
                    members[i : i + UNIT_REQUESTS] for i in range(0, len(members), UNIT_REQUESTS)
                ]
                continue
            self._work.popleft()
        return None

    def _keyed(self, unit: _Unit, future: Future[KeyedUnit]) -> None:
        try:
            keyed = future.result()
        except FatalEngineError:  # storage that cannot be reached: the job stops, loudly
            raise
        except Exception as exc:  # a reader bug: the unit's requests fail, the job goes on
            message = f"reading failed: {type(exc).__name__}: {exc}"
            keyed = KeyedUnit(
                failures=[Result.failure(r.id, "load", message, "other") for r in unit.requests]
            )
        unit.keyed = keyed
        self._count(unit.tag, bytes_read=keyed.bytes_read)
        for loaded in keyed.loaded:
            for key in loaded.media_keys:
                self.store.pin(key)
        for job in keyed.jobs:
            missing = [key for key in job.keys if key not in self.store]
            if not missing:
                continue
            unit.waiting.update(missing)
            started = [key for key in missing if key in self._decoding]
            for key in missing:
                self._decoding.setdefault(key, []).append(unit)
            if len(started) < len(missing):
                self._decode(job, unit.tag)
        if not unit.waiting:
            self._finish(unit)

    def _decode(self, job: DecodeJob, tag: Hashable) -> None:
        self._raw += job.held_bytes
        self._decoders.submit(job, partial(self._post_decoded, tag))

    def _post_decoded(self, tag: Hashable, job: DecodeJob, made: Decoded) -> None:
        """The decoders' callback: hand the outcome to the coordinator."""
        self._events.put(("decoded", (job, tag, made)))

    def _decoded(self, job: DecodeJob, tag: Hashable, made: Decoded) -> None:
        if self._decoders.fatal is not None:
            raise self._decoders.fatal
        self._raw -= job.held_bytes
        for key, item in made.items():
            if isinstance(item, ItemError):
                self._errors[key] = item
            else:
                self.store.put(item)
                self._count(tag, decodes=1)
            for unit in self._decoding.pop(key, []):
                unit.waiting.discard(key)
                if not unit.waiting:
                    self._finish(unit)

    def _count(self, tag: Hashable, decodes: int = 0, bytes_read: int = 0) -> None:
        counts = self._counts.get(tag)
        if counts is not None:
            counts[0] += decodes
            counts[1] += bytes_read

    def _finish(self, unit: _Unit) -> None:
        self._preparing -= 1
        keyed = unit.keyed
        assert keyed is not None
        ready = Ready(unit.tag, failures=list(keyed.failures))
        for loaded in keyed.loaded:
            media = {k: item for k in loaded.media_keys if (item := self.store.get(k))}
            failure = failure_of(loaded, media, self._errors, self.limits)
            if failure is None:
                ready.loaded.append(loaded)
                ready.media.update(media)
            else:
                ready.failures.append(failure)
                for key in loaded.media_keys:
                    self.store.unpin(key)
        unit.keyed = None  # the raw bytes it read go now
        self._publish(ready)

    def _publish(self, ready: Ready) -> None:
        with self._cond:
            same = self._ready_by_media.get(_media_of(ready)) if ready.loaded else None
            if same is not None and same.tag == ready.tag:
                # Another unit read the very same media (equal bytes under other names):
                # its requests go to the engine together with this one's.
                same.loaded += ready.loaded
                same.failures += ready.failures
            else:
                self._ready.append(ready)
                if ready.loaded:
                    self._ready_by_media.setdefault(_media_of(ready), ready)
            self._cond.notify_all()


def _media_of(ready: Ready) -> frozenset[str]:
    return frozenset(key for loaded in ready.loaded for key in loaded.media_keys)
