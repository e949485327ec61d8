"""The small set of values that flows through every stage of a job.

source rows -> ``Request`` -> loader -> ``MediaItem`` -> planner -> engine -> ``Result`` -> sink.

Everything here is a frozen dataclass with no heavy imports, so the planner, the sinks
and the tests can use these types without pulling in vLLM, torch or even Pillow.
Pixels live only in ``MediaItem.payload``; everything the planner sees is keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, astuple, dataclass, field, fields
from typing import Any, Literal, get_args

Modality = Literal["image", "video", "audio"]
"""The kinds of media a request can carry; the names match vLLM's ``multi_modal_data`` keys."""
MODALITIES: tuple[Modality, ...] = get_args(Modality)
"""Every ``Modality``, in the order above."""

Stage = Literal["source", "load", "decode", "validate", "engine", "parse", "sink"]
"""Where in the pipeline an item failed; error rows carry it so users can tell bad input
from a bad configuration. ``parse``: the text came back but is not the JSON the job asked for."""

FailureKind = Literal[
    "unreadable",  # the path or URL could not be read (missing, permissions, network)
    "empty",  # zero bytes
    "not_media",  # no decoder recognises the bytes (a text file named .jpg)
    "corrupt",  # recognised but broken (truncated, bad chunks)
    "too_large",  # over a size cap (pixels, bytes): refused before decoding
    "unsupported",  # a modality or format this job cannot handle
    "not_allowed",  # a path named inside an input leads outside its folder (sources.paths)
    "too_long",  # the prompt with its media does not fit the model's context
    "rejected",  # the engine refused the request for another reason
    "engine",  # the engine accepted the request, then failed or dropped it
    "unparsable",  # the answer is not in the format asked for (JSON against a schema)
    "other",
]
"""What went wrong with an item, coarser than the message and finer than the stage: the
summary and the quarantine file count failures by it."""


@dataclass(frozen=True)
class FrameAt:
    """One frame of a video: its index in presentation order and its time in seconds."""

    index: int
    pts: float


@dataclass(frozen=True)
class TimeSpan:
    """A stretch of a media file in seconds, ``[start, end)``: one window of a long audio."""

    start: float
    end: float


@dataclass(frozen=True)
class ClipSpan:
    """A stretch of a video cut out as a clip of its own (``--clip-seconds``, ``--scenes``):
    the video's frames ``[first, stop)`` in presentation order, shown from ``start`` to
    ``end`` seconds. The frame indices are what is decoded and keyed; the times are what
    the row says."""

    first: int
    stop: int
    start: float
    end: float


@dataclass(frozen=True)
class FileId:
    """A file as its file system numbers it: what a checked path led to when it was checked,
    so that the read can make sure it opened that very file (``mmbatch.sources.paths``)."""

    device: int
    inode: int


@dataclass(frozen=True)
class MediaRef:
    """What a source row points at, nothing decoded yet: a file to read, or media already
    in memory, the way datasets stores media as ``{bytes, path}``.

    With ``data`` (raw file bytes, e.g. a datasets ``Image(decode=False)`` cell) or ``image``
    (a picture some library already decoded, e.g. a PIL image from a datasets ``Image()``
    column), the loader reads nothing and ``source`` only names the item in output rows.
    ``data`` may be a byte ``memoryview`` into a memory-mapped Arrow file, so that a dataset
    larger than memory is not copied into it.

    ``part`` narrows a file: an image taken from one frame of a video (``FrameAt``), a
    window of an audio file (``TimeSpan``), or a clip cut from a video (``ClipSpan``);
    ``None`` is the whole file.

    ``pinned``, for a path the path rule checked (one named inside an input, or found by a
    folder walk), is the file it led to then: a read that opens another file (a symlink
    swapped in since) reads nothing and fails the item. ``None``: a path the person running
    the job named, read as it is.
    """

    modality: Modality
    source: str
    data: bytes | memoryview | None = field(default=None, repr=False)
    image: Any = field(default=None, repr=False)
    part: FrameAt | TimeSpan | ClipSpan | None = None
    pinned: FileId | None = None

    def __post_init__(self) -> None:
        if self.data is not None and self.image is not None:
            raise ValueError(f"media {self.source!r} has both bytes and a decoded image")


@dataclass(frozen=True)
class MediaItem:
    """One distinct piece of media, loaded once and shared by every request that uses it.

    ``key`` hashes the source bytes *and* the decode options: vLLM trusts
    ``multi_modal_uuids`` blindly, so two decodings of the same file must never share a key.
    """

    modality: Modality
    key: str
    payload: Any
    meta: dict[str, Any] = field(default_factory=dict)


class InvalidSetting(ValueError):
    """A setting outside what it allows: ``field`` names it, ``rule`` says what is valid, so
    each face can name it its own way (``--top-p``, ``[sampling] top_p``, a batch line's
    ``top_p``)."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        super().__init__(f"{field} must be {rule}, got {value!r}")
        self.field = field
        self.value = value
        self.rule = rule


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of a job: greedy by default, so runs are reproducible.

    A setting left ``None`` takes the model's own value from its ``generation_config`` (as
    vLLM does: Qwen's sets a repetition penalty that keeps captions from looping), and where
    the model sets none, vLLM's default. ``temperature=None`` hands the temperature to the
    model as well (vLLM's default is then 1.0)."""

    max_tokens: int = 128
    temperature: float | None = 0.0
    top_p: float | None = None
    top_k: int | None = None
    """Sample from the ``top_k`` likeliest tokens; 0 (or -1): no limit."""
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: tuple[str, ...] = ()
    """Stop at the first of these strings (not included in the text)."""
    n: int = 1
    """Completions per request; with more than one, a row's ``text`` is a list of them."""
    seed: int | None = None
    ignore_eos: bool = False
    json_schema: str | None = None
    """A JSON schema (as canonical JSON text) the output must follow, enforced while decoding
    through the engine's structured outputs; None: free text."""
    logprobs: int | None = None
    """Return each generated token's log probability, with the ``logprobs`` likeliest tokens
    at its step (0: the chosen token's alone; -1: the whole vocabulary, within the engine's
    ``max_logprobs``); None: none. OpenAI batch lines ask for them (``logprobs``,
    ``top_logprobs``)."""

    def __post_init__(self) -> None:
        found = sampling_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if found:
            raise found[0]

    def explicit(self) -> dict[str, Any]:
        """The settings given a value (not ``None``), by name, for the engine to lay over the
        model's defaults."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def sampling_problems(values: Mapping[str, Any]) -> list[InvalidSetting]:
    """Every setting of ``values`` (``Sampling``'s fields by name; those left out take its
    defaults) outside what it allows, so that a caller can name them all at once."""
    v = {f.name: f.default for f in fields(Sampling)} | dict(values)
    found = [
        _check(v["max_tokens"], "max_tokens", "an integer >= 1", lambda x: x >= 1),
        _check(v["temperature"], "temperature", "a number >= 0", lambda x: x >= 0),
        _check(v["top_p"], "top_p", "in (0, 1]", lambda x: 0 < x <= 1),
        _check(v["top_k"], "top_k", "an integer >= 1, or 0 for no limit", lambda x: x >= -1),
        _check(v["min_p"], "min_p", "in [0, 1]", lambda x: 0 <= x <= 1),
        _check(v["repetition_penalty"], "repetition_penalty", "a number > 0", lambda x: x > 0),
        *(
            _check(v[name], name, "in [-2, 2]", lambda x: -2 <= x <= 2)
            for name in ("presence_penalty", "frequency_penalty")
        ),
        _check(v["n"], "n", "an integer >= 1", lambda x: x >= 1),
        _check(
            v["logprobs"], "logprobs", "an integer >= 0, or -1 for every token", lambda x: x >= -1
        ),
    ]
    if isinstance(v["n"], int) and v["n"] > 1 and v["temperature"] == 0:
        # Greedy decoding gives one answer however often it is asked (vLLM refuses it).
        found.append(InvalidSetting("n", v["n"], "1 at temperature 0 (greedy): set a temperature"))
    stop = v["stop"]  # a caller may pass one string where a tuple is due
    if not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) and s for s in stop):
        found.append(InvalidSetting("stop", stop, "a list of non-empty strings"))
    return [problem for problem in found if problem is not None]


def _check(
    value: Any, field: str, rule: str, valid: Callable[[Any], bool]
) -> InvalidSetting | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return InvalidSetting(field, value, rule)
    if not math.isfinite(value):  # inf passes ">= 0"; nan passes no comparison
        return InvalidSetting(field, value, f"{rule}, and finite")
    return None if valid(value) else InvalidSetting(field, value, rule)


@dataclass(frozen=True)
class ItemError:
    """Why an item produced no text: the stage that failed and a message naming the cause."""

    stage: Stage
    message: str
    kind: FailureKind = "other"

    def to_dict(self) -> dict[str, str]:
        return {"stage": self.stage, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Turn:
    """An earlier message of a conversation: a user's (with ``media`` of the request's media,
    taken in order) or the assistant's answer. OpenAI batch lines with several turns carry
    them; the request's own ``prompt`` is the last user message."""

    role: Literal["user", "assistant"]
    text: str
    media: int = 0


@dataclass(frozen=True)
class Request:
    """One prompt over zero or more media references, identified by a job-unique ``id``.

    A job that asks several questions about one item makes one request per question, all
    with the item's ``item_id`` and each with its ``output`` name; the item still gets one
    output row, written when all of its requests have finished.
    """

    id: str
    prompt: str
    media: tuple[MediaRef, ...] = ()
    system: str | None = None
    item_id: str | None = None
    """The output row this request is part of; None: its own row, named by ``id``."""
    output: str | None = None
    """The name of this request's answer within its item's row (multi-output jobs)."""
    sampling: Sampling | None = None
    """This request's own sampling settings (OpenAI batch lines carry them); None: the job's."""
    columns: tuple[tuple[str, Any], ...] = ()
    """Extra columns for this request's output row, e.g. a video frame's ``video``,
    ``frame_index`` and ``pts``, or an audio window's ``start`` and ``end``."""
    history: tuple[Turn, ...] = ()
    """The conversation before ``prompt``, if any; its turns' media come first in ``media``."""
    error: ItemError | None = None
    """Set by a source that found this input unusable while listing it (a video it could not
    index, a dataset cell holding no picture, a batch line asking for what cannot be served):
    the request is never loaded or sent, and its row is this error, so the input still gets
    exactly one row saying why."""

    @property
    def row_id(self) -> str:
        return self.item_id if self.item_id is not None else self.id


@dataclass(frozen=True)
class LoadedRequest:
    """A request whose media have been read and hashed (``media_keys`` align with ``media``)."""

    request: Request
    media_keys: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.request.id


@dataclass(frozen=True)
class Usage:
    """Token counts for one request, as the engine reported them."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        """The counts of two requests together (an item's answers, summed)."""
        return Usage(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log probability, as the engine reported it: the token's text as
    the engine decoded it, its UTF-8 ``bytes`` (None: the engine decoded none), and the
    ``candidates`` at its step, the chosen token first, then the likeliest by rank."""

    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None
    candidates: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Choice:
    """One completion of a request that asked for several (``Sampling.n`` > 1)."""

    text: str
    finish_reason: str | None = None
    output_tokens: int = 0
    stop_reason: int | str | None = None
    """What stopped it, when a stop string (the string) or stop token (its id) did."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Each generated token's log probability, when ``Sampling.logprobs`` asked for them."""


@dataclass(frozen=True)
class Result:
    """The outcome of one request: text, or an error. Errors are data, never exceptions."""

    request_id: str
    text: str | None = None
    finish_reason: str | None = None
    usage: Usage = Usage()
    error: ItemError | None = None
    choices: tuple[Choice, ...] = ()
    """Every completion, when the request asked for more than one (``text``,
    ``finish_reason``, ``stop_reason`` and ``logprobs`` are then the first's,
    ``usage.output_tokens`` their sum); empty for one."""
    stop_reason: int | str | None = None
    """The stop string (or stop token id) that ended the text, if one did."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Each generated token's log probability, when the request's sampling asked for them."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failure(
        cls, request_id: str, stage: Stage, message: str, kind: FailureKind = "other"
    ) -> Result:
        return cls(request_id=request_id, error=ItemError(stage, message, kind))


@dataclass(frozen=True)
class CacheStats:
    """An engine's cumulative cache counters, in tokens (prefix) and items (multimodal)."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    mm_queries: int = 0
    mm_hits: int = 0

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None

    @property
    def mm_hit_rate(self) -> float | None:
        return self.mm_hits / self.mm_queries if self.mm_queries else None


@dataclass(frozen=True)
class Restarts:
    """An engine's restarts so far, cumulative as ``CacheStats``: its engines started again
    after their process died (``count``), and the seconds those starts took, summed (each
    from its process's start to its engine ready; one still starting, up to now).
    ``engines``: how many engines it runs side by side, of which a restart holds one."""

    count: int = 0
    seconds: float = 0.0
    engines: int = 1

    def since(self, earlier: Restarts) -> Restarts:
        """The restarts after ``earlier`` (the same engine's figures, read before)."""
        return Restarts(self.count - earlier.count, self.seconds - earlier.seconds, self.engines)
