"""From finished requests to output rows, and back: exactly one row per item, whatever its shape.

A ``RowShape`` is both directions of one kind of output row. Forwards, its ``builder`` takes
every finished ``Result`` (text or error) and answers with the rows that are now complete.
Backwards, ``row_id`` and ``outcome`` read a written row again: which item it is and how it
went, which is all that resuming, counting and the quarantine file need, whatever else the
row holds.

* ``FLAT`` (``mmbatch caption``, ``frames``): one row per request, complete at once.
* ``ItemShape`` (recipes): several questions per item; each item's answers are held until
  the last one arrives, then written as one row with every answer under its name, so a failed
  question is recorded in its place and never costs the item its other answers.
* ``mmbatch.openai_batch.writer.OpenAIBatchShape``: the lines of an OpenAI batch output file.

Each ``Row`` also carries an ``outcome``: the item's summed token counts and its error (if
any answer failed), which is what the job's stats count, one per row.

The columns these rows may hold are declared once, in ``mmbatch.row_schema``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

from mmbatch.errors import ItemFailure
from mmbatch.row_schema import TOKEN_COLUMNS
from mmbatch.storage.urls import shown
from mmbatch.types import FailureKind, ItemError, Request, Result, Stage, Usage

OutputParser = Callable[[str], Any]
"""Turns an answer's text into a value, raising ``ValueError`` (with the reason) when the
text is not what was asked for."""


@dataclass(frozen=True)
class Row:
    """A finished output row and the outcome the stats count for it."""

    outcome: Result
    data: dict[str, Any]


class RowBuilder(Protocol):
    def add(self, request: Request, media_keys: tuple[str, ...], result: Result) -> Row | None:
        """Take one finished request; return its item's row if that row is now complete."""
        ...


class RowShape(Protocol):
    """One kind of output row, both ways: built from results, and read back."""

    def builder(self, requests: Sequence[Request]) -> RowBuilder:
        """A builder for one run over ``requests`` (it may hold items until they complete)."""
        ...

    def row_id(self, row: Mapping[str, Any]) -> str:
        """The item a written row belongs to: what resume skips and the output is keyed by."""
        ...

    def outcome(self, row: Mapping[str, Any]) -> Result:
        """How a written row's item went (its error and token counts), for counting."""
        ...

    def is_row(self, row: Mapping[str, Any]) -> bool:
        """Whether ``row`` has this shape's fields (a line of some other file has not):
        resume touches no file whose lines are not all rows."""
        ...

    def asked(self, row: Mapping[str, Any]) -> Asked | None:
        """The prompts a written row's answers were asked, or None where the shape does not
        record them: resume redoes an item whose prompts changed since (an edited manifest)."""
        ...


Asked = dict[str | None, str]
"""The prompt of each answer of an item, by ``Request.output`` (None: a flat row's one)."""


def asked_of(requests: Sequence[Request]) -> dict[str, Asked]:
    """What ``requests`` ask, item by item (by ``Request.row_id``), to compare with
    ``RowShape.asked`` of the rows written before."""
    items: dict[str, Asked] = {}
    for request in requests:
        items.setdefault(request.row_id, {})[request.output] = request.prompt
    return items


def answer_text(result: Result) -> str | list[str] | None:
    """A result's text for a row: the text, or the list of its ``n`` completions."""
    return [c.text for c in result.choices] if result.choices else result.text


def answer_finish_reason(result: Result) -> str | list[str | None] | None:
    """Why the text ended, or why each of its ``n`` completions did."""
    return [c.finish_reason for c in result.choices] if result.choices else result.finish_reason


def token_counts(usage: Usage) -> dict[str, int]:
    """A row's token columns (``TOKEN_COLUMNS``) of ``usage``."""
    return asdict(usage)


def output_row(request: Request, media_keys: tuple[str, ...], result: Result) -> dict[str, Any]:
    """The flat JSON row for one request: what it was, and its text or the reason it has none."""
    sources = [shown(ref.source) for ref in request.media]
    return {
        "id": request.id,
        "source": sources[0] if len(sources) == 1 else sources,
        "media_hash": media_keys[0] if len(media_keys) == 1 else (list(media_keys) or None),
        "prompt": request.prompt,
        "text": answer_text(result),
        "finish_reason": answer_finish_reason(result),
        **token_counts(result.usage),
        "error": result.error.to_dict() if result.error else None,
        **dict(request.columns),
    }


class _IdAndErrorRows:
    """Reading back a row that carries ``id``, ``error`` and token counts at its top level,
    as flat and item rows both do."""

    def row_id(self, row: Mapping[str, Any]) -> str:
        return str(row["id"])

    def outcome(self, row: Mapping[str, Any]) -> Result:
        usage = Usage(*(int(row.get(k) or 0) for k in TOKEN_COLUMNS))
        return Result(self.row_id(row), usage=usage, error=error_from(row.get("error")))


def error_from(value: Any) -> ItemError | None:
    """The ``ItemError`` a row's ``error`` field holds (None for a row that succeeded)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return ItemError("engine", str(value), "other")
    stage = cast(Stage, str(value.get("stage") or "engine"))
    kind = cast(FailureKind, str(value.get("kind") or "other"))
    return ItemError(stage, str(value.get("message") or ""), kind)


class FlatRows(_IdAndErrorRows):
    """One row per request, in the flat format of ``mmbatch caption``."""

    def builder(self, requests: Sequence[Request]) -> FlatRows:
        return self

    def is_row(self, row: Mapping[str, Any]) -> bool:
        return row.keys() >= _FLAT_FIELDS

    def asked(self, row: Mapping[str, Any]) -> Asked | None:
        prompt = row.get("prompt")
        return {None: prompt} if isinstance(prompt, str) else None

    def add(self, request: Request, media_keys: tuple[str, ...], result: Result) -> Row:
        return Row(result, output_row(request, media_keys, result))


_FLAT_FIELDS = frozenset({"id", "source", "prompt", "text", "error"})
FLAT = FlatRows()
"""The shape of ``mmbatch caption`` and ``frames`` rows."""


class MediaRows(_IdAndErrorRows):
    """Rows of a job without a model (``mmbatch frames`` without ``--model``): what each
    item is and where it went (a frame's ``video``, ``frame_index``, ``pts``,
    ``frame_path``), or why it failed."""

    def builder(self, requests: Sequence[Request]) -> MediaRows:
        return self

    def is_row(self, row: Mapping[str, Any]) -> bool:
        return {"id", "media_hash", "error"} <= row.keys()

    def asked(self, row: Mapping[str, Any]) -> Asked | None:
        return None  # nothing is asked of an item without a model

    def add(self, request: Request, media_keys: tuple[str, ...], result: Result) -> Row:
        data = {
            "id": request.id,
            **dict(request.columns),
            "media_hash": media_keys[0] if len(media_keys) == 1 else (list(media_keys) or None),
            "error": result.error.to_dict() if result.error else None,
        }
        return Row(result, data)


MEDIA_ONLY = MediaRows()
"""The shape of rows of media extracted without a model."""


class ItemShape(_IdAndErrorRows):
    """Rows of several answers per item (recipes): see ``ItemRows``."""

    def __init__(self, parse: OutputParser | None = None) -> None:
        self.parse = parse

    def builder(self, requests: Sequence[Request]) -> ItemRows:
        return ItemRows(requests, self.parse)

    def is_row(self, row: Mapping[str, Any]) -> bool:
        return {"id", "source", "outputs", "error"} <= row.keys() and isinstance(
            row["outputs"], Mapping
        )

    def asked(self, row: Mapping[str, Any]) -> Asked | None:
        outputs = row.get("outputs")
        if not isinstance(outputs, Mapping):
            return None
        return {
            str(name): str(answer.get("prompt"))
            for name, answer in outputs.items()
            if isinstance(answer, Mapping)
        }


@dataclass
class _OpenItem:
    names: list[str]
    first: Request
    media_keys: tuple[str, ...] = ()
    answers: dict[str, tuple[Request, Result]] = field(default_factory=dict)


class ItemRows:
    """Assembles the answers of each item's requests (grouped by ``Request.item_id``, named
    by ``Request.output``) into one row per item, answers in the order they were asked.

    ``parse``, when given, turns each successful answer's text into ``parsed``; a text it
    refuses becomes that answer's error at stage ``parse``, with the raw text kept.
    """

    def __init__(self, requests: Sequence[Request], parse: OutputParser | None = None) -> None:
        self.parse = parse
        self._open: dict[str, _OpenItem] = {}
        for request in requests:
            if request.item_id is None or request.output is None:
                raise ValueError(f"request {request.id!r} names no item_id and output")
            item = self._open.setdefault(request.item_id, _OpenItem([], request))
            if request.output in item.names:
                raise ValueError(f"item {request.item_id!r} asks {request.output!r} twice")
            item.names.append(request.output)

    def add(self, request: Request, media_keys: tuple[str, ...], result: Result) -> Row | None:
        assert request.item_id is not None
        assert request.output is not None
        item = self._open[request.item_id]
        item.answers[request.output] = (request, result)
        item.media_keys = item.media_keys or media_keys
        if len(item.answers) < len(item.names):
            return None
        del self._open[request.item_id]
        return self._row(request.item_id, item)

    def unfinished(self) -> list[str]:
        """Items still waiting for answers (empty once a job has finished)."""
        return sorted(self._open)

    def _row(self, item_id: str, item: _OpenItem) -> Row:
        outputs: dict[str, dict[str, Any]] = {}
        failures: list[tuple[str, ItemError]] = []
        usage = Usage()
        for name in item.names:
            request, result = item.answers[name]
            answer, error = self._answer(request, result)
            outputs[name] = answer
            if error is not None:
                failures.append((name, error))
            usage += result.usage
        error = _item_error(failures, len(item.names))
        sources = [shown(ref.source) for ref in item.first.media]
        keys = item.media_keys
        data = {
            "id": item_id,
            "source": sources[0] if len(sources) == 1 else sources,
            "media_hash": keys[0] if len(keys) == 1 else (list(keys) or None),
            **dict(item.first.columns),
            "outputs": outputs,
            **token_counts(usage),
            "error": error.to_dict() if error else None,
        }
        return Row(Result(item_id, usage=usage, error=error), data)

    def _answer(self, request: Request, result: Result) -> tuple[dict[str, Any], ItemError | None]:
        error = result.error
        answer: dict[str, Any] = {"prompt": request.prompt, "text": answer_text(result)}
        if self.parse is not None:
            parsed: Any = None
            if error is None and result.text is not None:
                texts = [c.text for c in result.choices] or [result.text]
                try:
                    values = [self.parse(text) for text in texts]
                except ValueError as exc:
                    error = ItemError("parse", str(exc), "unparsable")
                except ItemFailure as exc:  # the schema could not be applied
                    error = ItemError(exc.stage, str(exc), exc.kind)
                else:
                    parsed = values if result.choices else values[0]
            answer["parsed"] = parsed
        answer.update(
            finish_reason=answer_finish_reason(result),
            **token_counts(result.usage),
            error=error.to_dict() if error else None,
        )
        return answer, error


def _item_error(failures: list[tuple[str, ItemError]], asked: int) -> ItemError | None:
    """The item's error: None if every answer succeeded; the shared error if every answer
    failed the same way (a picture that does not decode); else a summary naming each."""
    if not failures:
        return None
    errors = {error for _, error in failures}
    if len(failures) == asked and len(errors) == 1:
        return failures[0][1]
    detail = "; ".join(f"{name}: {error.stage}: {error.message}" for name, error in failures)
    first = failures[0][1]
    return ItemError(
        first.stage, f"{len(failures)} of {asked} outputs failed ({detail})", first.kind
    )
