"""What a gallery card shows of a row, whatever output the row comes from.

The rows of ``mmbatch caption``, ``frames`` and ``run`` carry ``id``, ``source``, ``prompt``,
``text`` and ``error`` at their top level, which is what the cards, the counts and the error
filter read. An OpenAI batch output line does not: it is known by its ``custom_id``, and its
answer or its error sits inside ``response``. ``card_rows`` makes such lines into the first
form (through the line's own row shape, so a 400 line is an error under its custom_id), and
reads their prompts and pictures again from the batch input file the summary names, since
the output holds neither.

Sources in rows are as the job named them; a relative one is relative to the folder the
job ran in, which the summary records (``cwd``), not to wherever the report is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmbatch.out.openai_batch import OpenAIBatchShape
from mmbatch.types import MediaRef


def is_batch_line(row: Mapping[str, Any]) -> bool:
    return "custom_id" in row and isinstance(row.get("response"), Mapping)


def card_rows(
    rows: Sequence[dict[str, Any]], summary: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, MediaRef]]:
    """``rows`` as the cards read them, and the media of rows whose output does not name
    them (an OpenAI batch line's pictures, by custom_id)."""
    if not any(is_batch_line(row) for row in rows):
        return list(rows), {}
    requests = _batch_requests(summary)
    shape = OpenAIBatchShape("")
    cards = []
    media: dict[str, MediaRef] = {}
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
        if request is not None and request.media:
            media[custom_id] = request.media[0]
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
    relative paths resolved where the job ran); none when it is gone or unreadable."""
    from mmbatch.errors import MmbatchError
    from mmbatch.sources.openai_batch import read_batch
    from mmbatch.sources.paths import LocalPaths

    job = (summary or {}).get("job", {})
    inputs = job.get("inputs") or []
    if len(inputs) != 1:
        return {}
    folder = job_folder(summary)
    path = Path(located(str(inputs[0]), [folder] if folder else []))
    try:
        # Where the job could read; the prompts and pictures only (no vLLM to import).
        batch = read_batch(path, paths=LocalPaths.recorded(job), bodies=False)
    except (MmbatchError, OSError):
        return {}
    return {request.id: request for request in batch.requests}
