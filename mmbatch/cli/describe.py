"""A job described without running it: what ``--dry-run`` and ``mmbatch check`` print.

Both answer "what would this do?" before anything costly: ``check`` for a recipe alone (its
keys, its questions, whether a model can hold it), ``--dry-run`` for a whole job (the items
its inputs became, what listing passed over and why, the plan's shape, the token budget,
the engines this host would start). Neither starts an engine or writes an output. A dry
run imports neither vLLM nor torch: it answers in seconds, while an engine takes a minute;
``check --model`` reads vLLM's token counts for the model (an import of vLLM, no engine).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.decode_only import DecodeOnly

if TYPE_CHECKING:
    from mmbatch.engine.base import Engine
    from mmbatch.jobs import Job
    from mmbatch.recipe.spec import Recipe
    from mmbatch.types import Request

SHOWN = 20
"""Items (and items passed over) a dry run names one by one; the rest are counted."""


def describe_recipe(path: str, recipe: Recipe, model: str | None) -> str:
    """One line: the recipe's media, questions, output and model."""
    questions = ", ".join(q.name for q in recipe.questions)
    output = "json (schema enforced)" if recipe.output.format == "json" else "text"
    return (
        f"{path}: ok: {recipe.name}: {recipe.media.kind} input, "
        f"{len(recipe.questions)} question(s) [{questions}], {output} output, "
        f"max_tokens {recipe.sampling.max_tokens}, model {model or '(pass --model)'}"
    )


def describe_job(
    job: Job, engine: Engine | EngineConfig, on_ray: bool = False, out: str | None = None
) -> list[str]:
    """The lines of a dry run of ``job`` on ``engine`` (``on_ray``: on Ray's actors) into
    ``out`` (None: not given)."""
    from mmbatch.planner import plan

    requests = list(job.requests)
    refused = _first_of_each_item(r for r in requests if r.error is not None)
    items = _first_of_each_item(requests)
    inputs = ", ".join(map(str, job.info.get("inputs", ()))) or "(none)"
    limit = job.info.get("limit")
    cut = f" (--limit {limit}: the first {limit})" if limit is not None else ""
    lines = [f"dry run: {len(items)} items{cut} from {inputs}; nothing is run or written"]
    lines += [f"  {_item(r)}" for r in items[:SHOWN]]
    if len(items) > SHOWN:
        lines.append(f"  ... and {len(items) - SHOWN} more")
    lines += [f"note: {note}" for note in job.notes]  # what listing passed over, and why
    if refused:
        lines.append(f"refused while listing: {len(refused)} items, each a row saying why:")
        lines += [f"  {r.row_id}: {r.error.message}" for r in refused[:SHOWN] if r.error]
        if len(refused) > SHOWN:
            lines.append(f"  ... and {len(refused) - SHOWN} more")
    runnable = [r for r in requests if r.error is None]
    sources = {ref.source for r in runnable for ref in r.media}
    lines.append(
        f"plan: {len(runnable)} requests, {len(sources)} distinct media (by source), "
        f"{len(plan(runnable))} groups"
    )
    if not isinstance(engine, DecodeOnly):  # without a model nothing is answered
        lines.append(f"token budget: {token_budget(job, engine, runnable)}")
    lines.append(f"engines: {_engines(engine, len(runnable), on_ray)}")
    if out is not None:
        lines.append(f"output: {_output(out)}")
    return lines


def _output(out: str) -> str:
    """What a run would do with ``out``: begin it, or resume it (its rows are not read
    here: a run checks them, and passes over the items they answer)."""
    from mmbatch.output.target import in_store

    if not in_store(out) and not Path(out).exists():
        return f"{out}, new"
    return f"{out}; a run resumes there, passing over the items that have a row"


def token_budget(job: Job, engine: Engine | EngineConfig, requests: Sequence[Request]) -> str:
    """The context each request has and the longest answer asked for, from the model's
    config file and the job's sampling; the prompts themselves are measured as the job runs
    (vLLM's token counts for the model), each one over being its item's error row."""
    answers = max(
        [(r.sampling or job.sampling).max_tokens for r in requests] or [job.sampling.max_tokens]
    )
    context = model_context(engine) if isinstance(engine, EngineConfig) else None
    held = f"{context[0]} tokens a request ({context[1]})" if context else "the model's context"
    return (
        f"{held}, answers of up to {answers} tokens; each prompt is measured against it as "
        "the job runs (an item over it is an error row)"
    )


def model_context(config: EngineConfig) -> tuple[int, str] | None:
    """The tokens a request may hold: ``max_model_len`` where the user set it, else the
    model's ``max_position_embeddings`` from its config.json (a local model; None for a
    hub name or a config that does not say)."""
    given = config.engine_kwargs.get("max_model_len")
    if given is not None:
        return int(given), "max_model_len, as set"
    path = Path(config.model) / "config.json"
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    text = settings.get("text_config") or settings
    value = text.get("max_position_embeddings") or settings.get("max_position_embeddings")
    if not isinstance(value, int):
        return None
    return value, "the model's max_position_embeddings"


def _engines(engine: Engine | EngineConfig, requests: int, on_ray: bool) -> str:
    if on_ray:
        return "one per Ray actor (--replicas), each laid out on its node for its share of the job"
    if isinstance(engine, DecodeOnly):
        return "none: the media are only decoded (no --model)"
    if not isinstance(engine, EngineConfig):
        return f"the engine given ({type(engine).__name__})"
    if requests == 0:
        return "none: nothing to run"
    from mmbatch.engine.builder import read_host

    return read_host(engine).layout(requests).describe()


def _first_of_each_item(requests: Iterable[Request]) -> list[Request]:
    """The first request of each item, in listing order."""
    seen: dict[str, Request] = {}
    for request in requests:
        seen.setdefault(request.row_id, request)
    return list(seen.values())


def _item(request: Request) -> str:
    """An item as a dry run lists it: its id, and what it reads where that is not its id."""
    sources = ", ".join(str(ref.source) for ref in request.media) or "(text only)"
    return request.row_id if sources == request.row_id else f"{request.row_id}: {sources}"
