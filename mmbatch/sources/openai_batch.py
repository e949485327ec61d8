"""OpenAI batch input files read as requests, so a job written for a hosted batch API runs
here unchanged (the output lines are ``mmbatch.out.openai_batch``'s).

Input: one JSON object per line, ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions", "body": {"messages": [...], "max_tokens" | "max_completion_tokens",
"temperature", "top_p", "seed", "n", "stop", "presence_penalty", "frequency_penalty",
"response_format"}}``, plus vLLM's own sampling extras ``top_k``, ``min_p`` and
``repetition_penalty``, as vLLM's ``run-batch`` takes them. Messages are optional system (or
developer) messages, then user and assistant turns ending with a user message, whose content
is a string or a list of ``text`` and ``image_url`` parts; image URLs are ``data:`` URIs
(decoded in memory) or local paths (``file://`` or plain, relative to the requests file),
which must lead inside the requests file's folder or a folder the person running the job
allowed (``mmbatch.sources.paths``).
What a line leaves out takes the model's ``generation_config``, else vLLM's default
(temperature 1.0, as the hosted API).

Output: one line per request, ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}``, the body a ``chat.completion`` (choices, usage with
cached prompt tokens) or, for a request that failed, ``{"error": {...}}`` with status 400
(the request or its media were bad) or 500 (the engine failed it).

The requests go through the same loader, planner and engine windows as every other job:
lines sharing an image share its decode, its encoder output and their common prefix.

What is refused, per line (a 400 row, the other lines go on): other URLs or methods,
streaming, tools, tool or function messages, remote image URLs, local paths outside the
allowed folders (``not_allowed``), and any body parameter not
listed above; they would change the answer, and silently dropping them would return a
different answer than the hosted API would. A file that cannot be read as a batch (a line
that is not JSON, no ``custom_id``, a ``custom_id`` used twice) is refused whole, before any
work, as the hosted API refuses it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmbatch.errors import ConfigError, SourceError
from mmbatch.jsonl import JsonlError, read_objects
from mmbatch.sources.paths import LocalPaths, PathNotAllowed
from mmbatch.types import InvalidSetting, ItemError, MediaRef, Request, Sampling, Turn

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
DEFAULT_MAX_TOKENS = 1024
"""For lines that set neither ``max_tokens`` nor ``max_completion_tokens``: the hosted API
then stops only at the context length, which a batch job should not run into by default."""

_BODY_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "response_format",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
        "stream",
        "user",
        "metadata",
        "store",
    }
)


class InvalidLine(ValueError):
    """A line that is a well-formed batch entry but asks for something we cannot serve."""


@dataclass(frozen=True)
class _Place:
    """Where a batch file's local image paths start from, and where they may lead."""

    folder: str
    paths: LocalPaths


@dataclass(frozen=True)
class BatchInput:
    """A batch file read: one request per line (a line refused up front carries its error)."""

    requests: list[Request]
    max_images: int

    @property
    def refused(self) -> int:
        return sum(r.error is not None for r in self.requests)


def read_batch(
    path: str | Path,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    paths: LocalPaths | None = None,
) -> BatchInput:
    """Read an OpenAI batch input file into requests (ids are the lines' ``custom_id``);
    ``paths`` says where its local image paths may lead besides the file's own folder."""
    path = Path(path)
    place = _Place(str(path.parent), paths or LocalPaths())
    requests: list[Request] = []
    seen: set[str] = set()
    max_images = 0
    for line_no, entry in _lines(path):
        custom_id = entry.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise SourceError(f"{path}:{line_no}: no 'custom_id' (a non-empty string)")
        if custom_id in seen:
            raise SourceError(f"{path}:{line_no}: custom_id {custom_id!r} is used twice")
        seen.add(custom_id)
        try:
            request = _request(custom_id, entry, place, default_max_tokens)
        except InvalidLine as exc:
            requests.append(Request(custom_id, "", error=ItemError("source", str(exc))))
            continue
        except PathNotAllowed as exc:
            requests.append(Request(custom_id, "", error=ItemError(exc.stage, str(exc), exc.kind)))
            continue
        max_images = max(max_images, len(request.media))
        requests.append(request)
    if not seen:
        raise SourceError(f"{path} holds no requests")
    return BatchInput(requests, max_images)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        yield from read_objects(path)
    except JsonlError as exc:
        raise SourceError(str(exc)) from None


def _request(custom_id: str, entry: Mapping[str, Any], place: _Place, max_tokens: int) -> Request:
    if entry.get("method", "POST") != "POST":
        raise InvalidLine(f"method {entry.get('method')!r} is not supported (only POST)")
    if entry.get("url") != CHAT_COMPLETIONS_URL:
        raise InvalidLine(
            f"url {entry.get('url')!r} is not supported (only {CHAT_COMPLETIONS_URL})"
        )
    body = entry.get("body")
    if not isinstance(body, dict):
        raise InvalidLine("'body' must be an object")
    unknown = sorted(set(body) - _BODY_KEYS)
    if unknown:
        raise InvalidLine(f"unsupported parameter(s): {', '.join(map(repr, unknown))}")
    if body.get("stream", False):
        raise InvalidLine("streaming is not supported in a batch")
    system, history, prompt, media = _messages(body.get("messages"), custom_id, place)
    return Request(
        id=custom_id,
        prompt=prompt,
        media=media,
        system=system,
        sampling=_sampling(body, max_tokens),
        history=history,
    )


def _messages(
    messages: Any, custom_id: str, place: _Place
) -> tuple[str | None, tuple[Turn, ...], str, tuple[MediaRef, ...]]:
    """The system prompt, the earlier turns, the last user message and every image (the
    turns' in order, then the last message's)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidLine("'messages' must be a non-empty list")
    system_parts: list[str] = []
    turns: list[Turn] = []
    media: list[MediaRef] = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            if turns:
                raise InvalidLine(f"a {role} message must come before the conversation")
            texts, images = _parts(message.get("content"), custom_id, place, len(media))
            if images:
                raise InvalidLine(f"a {role} message cannot hold images")
            system_parts.extend(texts)
        elif role in ("user", "assistant"):
            texts, images = _parts(message.get("content"), custom_id, place, len(media))
            if role == "assistant" and images:
                raise InvalidLine("an assistant message cannot hold images")
            if not texts and not images:
                raise InvalidLine(f"the {role} message is empty")
            turns.append(Turn(role, "\n".join(texts), len(images)))
            media.extend(images)
        else:
            raise InvalidLine(
                f"message role {role!r} is not supported (system, developer, user, assistant)"
            )
    if not turns:
        raise InvalidLine("no user message")
    last = turns.pop()
    if last.role != "user":
        raise InvalidLine("the last message must be the user's (the one to answer)")
    system = "\n".join(system_parts) if system_parts else None
    return system, tuple(turns), last.text, tuple(media)


def _parts(
    content: Any, custom_id: str, place: _Place, before: int = 0
) -> tuple[list[str], list[MediaRef]]:
    """A message's texts and images; ``before`` images came in earlier messages."""
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        raise InvalidLine(f"message content must be a string or a list of parts, got {content!r}")
    texts: list[str] = []
    images: list[MediaRef] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str) or not url:
                raise InvalidLine("an image_url part has no url")
            images.append(_image_ref(url, f"{custom_id}#image{before + len(images)}", place))
        else:
            raise InvalidLine(f"content part {part!r} is not supported (text, image_url)")
    return texts, images


def _image_ref(url: str, label: str, place: _Place) -> MediaRef:
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidLine("a data: image URL must be base64 (data:image/...;base64,...)")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidLine(f"the data: image URL is not valid base64 ({exc})") from None
        return MediaRef("image", label, data=data)
    if url.startswith(("http://", "https://")):
        raise InvalidLine(
            "remote image URLs are not fetched; download the images and name their paths, "
            "or embed them as data: URIs"
        )
    return MediaRef("image", place.paths.resolve(url, place.folder, label))


def _sampling(body: Mapping[str, Any], default_max_tokens: int) -> Sampling:
    """The line's sampling; what it leaves out is the model's (``None``), as in vLLM's
    ``run-batch``, except the token limit (``default_max_tokens``)."""
    max_tokens = _number(body, "max_completion_tokens", _number(body, "max_tokens", None, int), int)
    floats = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")
    values: dict[str, Any] = {k: _number(body, k, None, float) for k in floats}
    values["repetition_penalty"] = _number(body, "repetition_penalty", None, float)
    values["top_k"] = _number(body, "top_k", None, int)
    try:
        return Sampling(
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            seed=_number(body, "seed", None, int),
            n=_number(body, "n", 1, int),
            stop=_stop(body.get("stop")),
            json_schema=_json_schema(body.get("response_format")),
            **values,
        )
    except InvalidSetting as exc:
        raise InvalidLine(f"{exc.field} must be {exc.rule}, got {exc.value!r}") from None


def _stop(stop: Any) -> tuple[str, ...]:
    """``stop``: absent, one string, or a list of strings (the API allows up to 4)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidLine(f"stop must be a string or a list of strings, got {stop!r}")


def _number(body: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
    """``body[key]`` checked to be a number of ``kind`` (an int passes as a float); absent or
    null gives ``default``, as in the hosted API."""
    value = body.get(key)
    if value is None:
        return default
    kinds = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise InvalidLine(f"{key} must be {'a number' if kind is float else 'an integer'}")
    return value


def _json_schema(response_format: Any) -> str | None:
    from mmbatch.out.answers import canonical_schema

    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return canonical_schema({"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        try:
            return canonical_schema(schema, "response_format.json_schema.schema")
        except ConfigError as exc:
            raise InvalidLine(str(exc)) from None
    raise InvalidLine(f"response_format {response_format!r} is not supported")
