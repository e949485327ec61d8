"""OpenAI batch input files read as requests, so a job written for a hosted batch API, or for
``vllm run-batch``, runs here unchanged (the output lines are ``openai_batch.writer``'s).

Input: one JSON object per line, ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions", "body": {"messages": [...], ...}}``. The body is read by vLLM's own
``ChatCompletionRequest`` (``openai_batch.vllm_protocol``), so its parameters have the types,
defaults and rules ``vllm run-batch`` gives them; those served are the token limit
(``max_tokens`` or ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``n``,
``stop``, the penalties, vLLM's sampling extras ``top_k``, ``min_p``,
``repetition_penalty`` and ``ignore_eos``, ``response_format``, and ``logprobs`` with
``top_logprobs``. Messages are optional system (or developer) messages, then user and
assistant turns ending with a user message, whose content is a string or a list of
``text`` and ``image_url`` parts; image URLs are ``data:`` URIs (decoded in memory), local
paths (``file://`` or plain, relative to the requests file), which must lead inside the
requests file's folder or a folder the person running the job allowed
(``mmbatch.sources.paths``), or http(s) URLs, fetched by the loader beside the engine when
the job allows URLs (``--allow-urls``, bounded in size and time as every input's are). What
a line leaves out takes the model's ``generation_config``, else vLLM's default (temperature
1.0, as the hosted API).

Output: one line per request, ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}``, the body a ``chat.completion`` (choices, usage with
cached prompt tokens) or, for a request that failed, ``{"error": {...}}`` with status 400
(the request or its media were bad) or 500 (the engine failed it).

The requests go through the same loader, planner and engine windows as every other job:
lines sharing an image share its decode, its encoder output and their common prefix.

What is refused, per line (a 400 row, the other lines go on): other URLs or methods,
streaming, tool or function messages, http(s) image URLs in a job that does not fetch URLs
and local paths outside the allowed folders (both ``not_allowed``), an image URL that cannot
be fetched (a 404, too large, too slow: the loader's error), a body vLLM's model refuses,
and any other parameter of vLLM's set to other than its default (``tools``, ``logit_bias``,
``echo``, ...) or that vLLM does not know: they would change the answer, and dropping them
would return another answer than the hosted API or ``run-batch`` would. A file that cannot
be read as a batch (a line that is not JSON, no ``custom_id``, a ``custom_id`` used twice)
is refused whole, before any work, as the hosted API refuses it.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmbatch.errors import ConfigError, ItemFailure, SourceError
from mmbatch.jsonl import JsonlError
from mmbatch.sources.paths import LocalPaths, is_fetched_url, url_not_allowed
from mmbatch.storage.located import Place, locate
from mmbatch.storage.urls import scheme, unsupported
from mmbatch.types import InvalidSetting, ItemError, MediaRef, Request, Sampling, Turn
from mmbatch.validation import listed

CHAT_COMPLETIONS_URL = "/v1/chat/completions"
DEFAULT_MAX_TOKENS = 1024
"""For lines that set neither ``max_tokens`` nor ``max_completion_tokens``: the hosted API
then stops only at the context length, which a batch job should not run into by default."""

SERVED = frozenset(
    {
        "messages",
        "model",
        "user",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "response_format",
        "logprobs",
        "top_logprobs",
    }
)
"""The body parameters of vLLM's ``ChatCompletionRequest`` a line may set to any value: the
others only to vLLM's default (``tool_choice: "none"``, ``echo: false``...)."""

UNUSED_KEYS = frozenset({"metadata", "store"})
"""OpenAI's parameters that vLLM's model lacks and that change no answer."""


class InvalidLine(ValueError):
    """A line that is a well-formed batch entry but asks for something we cannot serve."""


@dataclass(frozen=True)
class _Place:
    """Where a batch file's local image paths start from, and where they may lead; whether
    its http(s) image URLs may be fetched; whether the lines' parameters are read too."""

    folder: str
    paths: LocalPaths
    bodies: bool = True
    urls: bool = False


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
    *,
    bodies: bool = True,
    allow_urls: bool = False,
) -> BatchInput:
    """Read an OpenAI batch input file into requests (ids are the lines' ``custom_id``);
    ``paths`` says where its local image paths may lead besides the file's own folder;
    ``allow_urls`` lets its http(s) image URLs through, to be fetched by the loader (within
    the job's ``UrlPolicy``), else each is its line's error.
    ``bodies=False`` reads each line's messages alone (its prompt and pictures, for the
    gallery), leaving its parameters unchecked and vLLM unimported."""
    refusal = unsupported(str(path))
    if refusal is not None:
        raise SourceError(f"the batch file {refusal}")
    text = str(path)
    batch = locate(text if scheme(text) is not None else str(Path(text)))
    place = _Place(batch.parent.text, paths or LocalPaths(), bodies, allow_urls)
    lines = _lines(batch)
    path = batch.shown
    requests: list[Request] = []
    seen: set[str] = set()
    max_images = 0
    for line_no, entry in lines:
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
        except ItemFailure as exc:  # a path refused (PathNotAllowed), or that names no file
            requests.append(Request(custom_id, "", error=ItemError(exc.stage, str(exc), exc.kind)))
            continue
        max_images = max(max_images, len(request.media))
        requests.append(request)
    if not seen:
        raise SourceError(f"{path} holds no requests")
    return BatchInput(requests, max_images)


_IMAGE_PART = re.compile(rb'"type"\s*:\s*"image_url"')


@dataclass(frozen=True)
class BatchSize:
    """A local batch file counted without parsing it: what the engine's start needs to
    begin while the file is read (``mmbatch.engine.early``)."""

    lines: int
    """Its non-blank lines: about its requests."""
    max_images: int
    """The most image parts any line names (at least 1): at least what the file's widest
    request carries, as a line's text could only add to it."""


def count_batch(path: str | Path) -> BatchSize | None:
    """The size of the local batch file at ``path``, from its bytes alone (no JSON parsed,
    nothing of vLLM imported: milliseconds for thousands of lines); None for a file in
    storage (read once, by ``read_batch``) or one that cannot be read (``read_batch`` says
    why)."""
    if locate(str(path)).store is not None:
        return None
    lines = most = 0
    try:
        with open(path, "rb") as file:
            for line in file:
                if line.strip():
                    lines += 1
                    most = max(most, len(_IMAGE_PART.findall(line)))
    except OSError:
        return None
    return BatchSize(lines, max(most, 1))


def _lines(batch: Place) -> Iterator[tuple[int, dict[str, Any]]]:
    """The lines of the batch file, local or in storage."""
    try:
        yield from batch.lines()
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
    system, history, prompt, media = _messages(body.get("messages"), custom_id, place)
    return Request(
        id=custom_id,
        prompt=prompt,
        media=media,
        system=system,
        sampling=_sampling(body, max_tokens) if place.bodies else None,
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
    if is_fetched_url(url):
        if not place.urls:
            raise url_not_allowed(url, label)
        return MediaRef("image", url)
    return place.paths.resolve(url, place.folder, label).ref("image")


def _sampling(body: Mapping[str, Any], default_max_tokens: int) -> Sampling:
    """The line's sampling, its parameters read by vLLM's ``ChatCompletionRequest``; what it
    leaves out is the model's (``None``), as in vLLM's ``run-batch``, except the token limit
    (``default_max_tokens``)."""
    from mmbatch.openai_batch.vllm_protocol import InvalidBody, check_chat_body

    schema = _json_schema(body.get("response_format"))  # its own words for a bad schema
    try:
        checked = check_chat_body(body)
    except InvalidBody as exc:
        raise InvalidLine(str(exc)) from None
    if checked.values["stream"]:
        raise InvalidLine("streaming is not supported in a batch")
    unsupported = (checked.changed - SERVED) | (set(checked.unknown) - UNUSED_KEYS)
    if unsupported:
        names = ", ".join(listed([repr(k) for k in sorted(unsupported)]))
        raise InvalidLine(f"unsupported parameter(s): {names}")
    values = checked.values
    max_tokens = values["max_completion_tokens"]
    if max_tokens is None:
        max_tokens = values["max_tokens"]
    stop = values["stop"] or ()
    try:
        return Sampling(
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            temperature=values["temperature"],
            top_p=values["top_p"],
            top_k=values["top_k"],
            min_p=values["min_p"],
            repetition_penalty=values["repetition_penalty"],
            presence_penalty=values["presence_penalty"],
            frequency_penalty=values["frequency_penalty"],
            seed=values["seed"],
            n=1 if values["n"] is None else values["n"],
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            ignore_eos=values["ignore_eos"],
            json_schema=schema,
            # As vLLM's request asks its engine: top_logprobs only with logprobs on.
            logprobs=(values["top_logprobs"] or 0) if values["logprobs"] else None,
        )
    except InvalidSetting as exc:
        raise InvalidLine(f"{exc.field} must be {exc.rule}, got {exc.value!r}") from None


def _json_schema(response_format: Any) -> str | None:
    from mmbatch.output.answers import canonical_schema

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
