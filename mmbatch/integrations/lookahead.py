"""A plain ``DatasetMap`` call's look-ahead: the next batch already in the engine while this
batch's slowest requests finish.

datasets' ``map`` calls a plain function batch after batch, and writes each batch's answer
(and reads the next batch) before it calls again. A call that ran only its own batch left the
engine draining at its end: idle while the batch's slowest requests finished and while
datasets wrote the batch and read the next. So each call also submits the rows of the batch
that follows it in the dataset being mapped, read from datasets' own map frames (the shard,
where this batch sits in it, the batch size: ``map_place``), and the call for that batch
takes the answers that are its own.

A look-ahead is a guess, so a row takes a predicted answer only by identity: the same place
in the same shard, mapped by the same task on the same engine, and the same request (prompt,
media bytes or pixels, its name in errors, system, sampling). Any row that does not match
runs itself, as a call without a look-ahead does; a look-ahead none of whose rows matched
(a function that changes the batch before handing it over) stops the guessing for that map.
The guess is bounded (``LOOKAHEAD_BATCHES``, ``LOOKAHEAD_BYTES``), and the shard's last
batch guesses nothing and waits out anything still in flight, so a map leaves nothing
running behind it.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Hashable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from mmbatch.engine.base import Engine
from mmbatch.jobs import Job, rows_of, start_in_memory
from mmbatch.pipeline import Submission
from mmbatch.types import Request

LOOKAHEAD_BATCHES = 1
"""Batches submitted ahead of the one a call answers: one keeps the engine fed across the
gap between two calls; more would only hold more media."""
LOOKAHEAD_BYTES = 256 * 2**20
"""The most media bytes (cells' raw bytes, decoded pictures' pixels) a look-ahead holds; a
batch larger than that is guessed only in part."""

Predict = Callable[[range], Sequence[Request]]
"""The requests for the rows at these shard positions, each with the position as its id."""


@dataclass(frozen=True)
class MapPlace:
    """Where a batch sits in the map that calls the function: datasets' own view of it."""

    dataset: Any
    """The shard being mapped (the whole dataset without ``num_proc``)."""
    start: int
    """The shard position of the batch's first row."""
    size: int
    batch_size: int
    end: int
    """The rows the map covers in the shard (fewer with ``drop_last_batch``)."""
    offset: int
    """The shard's first row in the whole dataset (``num_proc``'s shards)."""
    with_indices: bool

    @property
    def stop(self) -> int:
        return self.start + self.size

    @property
    def last(self) -> bool:
        return self.stop >= self.end

    def ahead(self) -> range:
        """The shard positions of the rows a look-ahead guesses."""
        return range(self.stop, min(self.end, self.stop + LOOKAHEAD_BATCHES * self.batch_size))


def map_place(size: int) -> MapPlace | None:
    """The place of the batch of ``size`` rows that datasets' ``Dataset.map`` is handing to
    the caller's caller, found in datasets' own frames (``_map_single`` and the
    ``apply_function`` it calls); None where there is none or it is not as expected (a call
    from elsewhere, a streaming dataset's map, another datasets): no look-ahead then."""
    frame: types.FrameType | None = sys._getframe(1)
    indices: Any = None
    offset: Any = None
    while frame is not None:
        if frame.f_globals.get("__name__") == "datasets.arrow_dataset":
            name = frame.f_code.co_name
            if name == "apply_function" and indices is None:
                indices, offset = frame.f_locals.get("indices"), frame.f_locals.get("offset")
            elif name == "_map_single":
                return _place(frame.f_locals, indices, offset, size)
        frame = frame.f_back
    return None


def _place(map_locals: Any, indices: Any, offset: Any, size: int) -> MapPlace | None:
    import datasets

    shard = map_locals.get("shard")
    batch_size = map_locals.get("batch_size")
    if not (
        isinstance(shard, datasets.Dataset)
        and map_locals.get("batched") is True
        and map_locals.get("input_columns") is None
        and isinstance(batch_size, int)
        and batch_size > 0
        and isinstance(offset, int)
        and isinstance(indices, list)
        and len(indices) == size > 0
        and indices == list(range(indices[0], indices[0] + size))
    ):
        return None
    rows = shard.num_rows
    end = rows // batch_size * batch_size if map_locals.get("drop_last_batch") else rows
    with_indices = bool(map_locals.get("with_indices"))
    return MapPlace(shard, indices[0], size, batch_size, end, offset, with_indices)


@dataclass
class _Ahead:
    """Requests submitted for rows not asked for yet."""

    key: Hashable
    rows: range
    """The shard positions guessed (those whose requests were sent, and those not)."""
    requests: dict[int, Request]
    """The requests sent, by shard position."""
    submission: Submission


class LookAhead:
    """This process's look-aheads, across the calls of a map (and the maps that follow)."""

    def __init__(self) -> None:
        self._ahead: list[_Ahead] = []
        self._unused: list[Submission] = []
        """Look-aheads no call will take: running out, waited for before a map ends."""
        self._stopped: set[Hashable] = set()
        """Maps whose guesses missed: no more guessing for them."""
        self._lock = threading.Lock()

    def run(
        self, key: Hashable, job: Job, engine: Engine, place: MapPlace, predict: Predict
    ) -> list[dict[str, Any]]:
        """The rows of ``job`` (the batch at ``place``; its request ids are positions in the
        batch), each a predicted answer that is its own or its own run, after the rows of
        the next batch (``predict``) are submitted; ``key`` names the map (task, engine,
        shard)."""
        with self._lock:
            window = range(place.start, max(place.ahead().stop, place.stop))
            self._keep(lambda a: a.key == key and a.rows.start in window)
            taken = self._taken(job, place)
            if not taken and any(_meets(a.rows, place) for a in self._ahead):
                self._stopped.add(key)  # a guess covered this batch and missed every row
            own = [r for r in job.requests if r.error is None and r.id not in taken]
            mine = start_in_memory(replace(job, requests=own), engine) if own else None
            if not place.last and key not in self._stopped:
                self._guess(key, job, engine, place, predict)
        rows = _rows_taken(taken)
        if mine is not None:
            rows.extend(rows_of(mine)[0])
        with self._lock:
            self._keep(lambda a: a.rows.stop > place.stop)
            if place.last:
                self._keep(lambda a: False)
                self._stopped.discard(key)
        if place.last:
            self.finish()
        return rows

    def finish(self) -> None:
        """Wait out the look-aheads no call will take (their rows are not needed, and a map
        leaves nothing running behind it)."""
        with self._lock:
            unused, self._unused = self._unused, []
        for submission in unused:
            with suppress(Exception):  # whatever ended it, nothing waits for its rows
                submission.wait()

    def _keep(self, wanted: Callable[[_Ahead], bool]) -> None:
        """Keep the look-aheads ``wanted``; the others' rows will not be asked for."""
        dropped = [a for a in self._ahead if not wanted(a)]
        self._ahead = [a for a in self._ahead if wanted(a)]
        self._unused.extend(a.submission for a in dropped)
        self._unused = [s for s in self._unused if not s.done]

    def _taken(self, job: Job, place: MapPlace) -> dict[str, tuple[_Ahead, str]]:
        """For each request of ``job`` a look-ahead predicted as it is, that look-ahead and
        the id it sent it under."""
        taken: dict[str, tuple[_Ahead, str]] = {}
        for index, request in enumerate(job.requests):
            if request.error is not None or int(request.id) != index:
                continue
            for ahead in self._ahead:
                predicted = ahead.requests.get(place.start + index)
                if predicted is not None and replace(predicted, id=request.id) == request:
                    taken[request.id] = (ahead, predicted.id)
                    break
        return taken

    def _guess(
        self, key: Hashable, job: Job, engine: Engine, place: MapPlace, predict: Predict
    ) -> None:
        """Submit the rows after this batch that no look-ahead holds yet."""
        rows = place.ahead()
        held = [a.rows.stop for a in self._ahead]
        rows = range(max([rows.start, *held]), rows.stop)
        if not rows:
            return
        try:
            predicted = predict(rows)
        except Exception:  # reading the rows failed: datasets says why when it reads them
            self._stopped.add(key)
            return
        sent: dict[int, Request] = {}
        held_bytes = 0
        for request in predicted:
            held_bytes += sum(_media_bytes(ref) for ref in request.media)
            if held_bytes > LOOKAHEAD_BYTES:
                rows = range(rows.start, int(request.id))
                break
            if request.error is None:
                sent[int(request.id)] = request
        if not sent:
            return
        submission = start_in_memory(replace(job, requests=list(sent.values())), engine)
        self._ahead.append(_Ahead(key, rows, sent, submission))


def _meets(rows: range, place: MapPlace) -> bool:
    return rows.start < place.stop and place.start < rows.stop


def _rows_taken(taken: dict[str, tuple[_Ahead, str]]) -> list[dict[str, Any]]:
    """The rows of the predicted requests taken, each under its batch's id (waiting for the
    look-aheads that hold them)."""
    by_ahead: dict[int, dict[str, dict[str, Any]]] = {}
    rows = []
    for request_id, (ahead, predicted_id) in taken.items():
        answered = by_ahead.get(id(ahead))
        if answered is None:
            answered = by_ahead[id(ahead)] = {r["id"]: r for r in rows_of(ahead.submission)[0]}
        rows.append({**answered[predicted_id], "id": request_id})
    return rows


def _media_bytes(ref: Any) -> int:
    """What one media reference holds in memory: its bytes, or a decoded picture's pixels."""
    if ref.data is not None:
        return len(ref.data)
    image = ref.image
    if image is not None:
        width, height = image.size
        return int(width * height * len(image.getbands()))
    return 0
