"""What a gallery card shows of a row, whatever output the row comes from.

The rows of ``mmbatch caption``, ``frames`` and ``run`` carry ``id``, ``source``, ``prompt``,
``text`` and ``error`` at their top level, which is what the cards, the counts and the error
filter read. An OpenAI batch output line does not: it is known by its ``custom_id``, and its
answer or its error sits inside ``response``. ``card_rows`` makes such lines into the first
form (through the line's own row shape, so a 400 line is an error under its custom_id), and
reads their prompts and pictures again from the batch input file the summary names, since
the output holds neither.

A line refused before it became a request (a parameter that cannot be served, a remote
image URL, a path outside the allowed folders) is read again as far as its messages go, so
that its card still shows what it asked and the pictures that may be shown; never a remote
one, nor a file the job could not have read.

Sources in rows are as the job named them; a relative one is relative to the folder the
job ran in, which the summary records (``cwd``), not to wherever the report is made.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmbatch.openai_batch.writer import OpenAIBatchShape
from mmbatch.sources.paths import LocalPaths
from mmbatch.types import MediaRef, Request


def is_batch_line(row: Mapping[str, Any]) -> bool:
    return "custom_id" in row and isinstance(row.get("response"), Mapping)


NO_PICTURE = (
    "no picture of this line is shown (it names none, or only remote URLs, which are never "
    "fetched, or files where the job could not read)"
)


def card_rows(
    rows: Sequence[dict[str, Any]], summary: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, MediaRef | str]]:
    """``rows`` as the cards read them, and the media of rows whose output does not name
    them (an OpenAI batch line's first picture by custom_id, or why it shows none)."""
    if not any(is_batch_line(row) for row in rows):
        return list(rows), {}
    requests = _batch_requests(summary)
    shape = OpenAIBatchShape("")
    cards = []
    media: dict[str, MediaRef | str] = {}
    for row in rows:
        if not is_batch_line(row):
            cards.append(row)
            continue
        outcome = shape.outcome(row)
        custom_id = outcome.request_id
        body = row["response"].get("body") or {}
        choices = [c for c in body.get("choices") or [] if isinstance(c, Mapping)]
        texts = [str((c.get("message") or {}).get("content") or "") for c in choices]
        reasons = [c.get("finish_reason") for c in choices]
        request = requests.get(custom_id)
        if request is not None:
            media[custom_id] = request.media[0] if request.media else NO_PICTURE
        cards.append(
            {
                "id": custom_id,
                "source": [ref.source for ref in request.media] if request else None,
                "prompt": request.prompt if request else None,
                "text": (texts[0] if len(texts) == 1 else texts) if texts else None,
                "finish_reason": reasons[0] if len(reasons) == 1 else (reasons or None),
                "prompt_tokens": outcome.usage.prompt_tokens,
                "output_tokens": outcome.usage.output_tokens,
                "cached_tokens": outcome.usage.cached_tokens,
                "error": outcome.error.to_dict() if outcome.error else None,
                "status_code": row["response"].get("status_code"),
            }
        )
    return cards, media


def job_folder(summary: Mapping[str, Any] | None) -> Path | None:
    """The folder the job ran in (relative sources are relative to it), if recorded."""
    cwd = (summary or {}).get("job", {}).get("cwd")
    return Path(cwd) if isinstance(cwd, str) and cwd else None


def located(source: str, folders: Sequence[Path]) -> str:
    """``source`` as a path that exists: as it is when absolute, else under the first of
    ``folders`` that holds it (the first folder when none does, for the message)."""
    if Path(source).is_absolute() or not folders:
        return source
    for folder in folders:
        if (folder / source).exists():
            return str(folder / source)
    return str(folders[0] / source)


def _batch_requests(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The batch input's requests by custom_id, read again from the file the job read (its
    relative paths resolved where the job ran; a refused line as far as ``_asked`` reads
    it); none when it is gone or unreadable."""
    from mmbatch.errors import MmbatchError
    from mmbatch.jsonl import read_objects
    from mmbatch.openai_batch.reader import read_batch

    job = (summary or {}).get("job", {})
    inputs = job.get("inputs") or []
    if len(inputs) != 1:
        return {}
    folder = job_folder(summary)
    path = Path(located(str(inputs[0]), [folder] if folder else []))
    paths = LocalPaths.recorded(job)  # where the job could read
    try:
        # The prompts and pictures only: no vLLM to import for its models of the bodies.
        batch = read_batch(path, paths=paths, bodies=False)
        requests = {request.id: request for request in batch.requests}
        refused = {r.id for r in batch.requests if r.error is not None}
        for _, entry in read_objects(path) if refused else ():
            custom_id = entry.get("custom_id")
            if custom_id in refused:
                requests[custom_id] = _asked(entry, custom_id, str(path.parent), paths)
    except (MmbatchError, OSError, ValueError):
        return {}
    return requests


def _asked(entry: Mapping[str, Any], custom_id: str, folder: str, paths: LocalPaths) -> Request:
    """What a refused line asked, for its card: the text of its last user message, and
    those of its pictures that may be shown."""
    body = entry.get("body")
    messages = body.get("messages") if isinstance(body, Mapping) else None
    messages = messages if isinstance(messages, list) else []
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    content = users[-1].get("content") if users else None
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    texts: list[str] = []
    media: list[MediaRef] = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            ref = _shown_picture(url, f"{custom_id}#image{len(media)}", folder, paths)
            media += [ref] if ref is not None else []
    return Request(custom_id, "\n".join(texts), tuple(media))


def _shown_picture(url: Any, label: str, folder: str, paths: LocalPaths) -> MediaRef | None:
    """The picture ``url`` names, if a card may show it: a ``data:`` URI, or a file where
    the job could read (``LocalPaths``); never a remote URL."""
    from mmbatch.errors import ItemFailure

    if not isinstance(url, str) or url.startswith(("http://", "https://")):
        return None
    if url.startswith("data:"):
        try:
            return MediaRef(
                "image", label, data=base64.b64decode(url.partition(",")[2], validate=True)
            )
        except (binascii.Error, ValueError):
            return None
    try:
        return paths.resolve(url, folder, label).ref("image")
    except ItemFailure:  # a path the job could not read
        return None
