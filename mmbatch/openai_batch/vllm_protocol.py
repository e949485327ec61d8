"""vLLM's own pydantic models of OpenAI chat completions, for the lines of an OpenAI batch
file: the request body a line carries (``ChatCompletionRequest``), and the response it is
answered with (``ChatCompletionResponse``: its choices, messages, log probabilities and
usage). Reading and writing the lines through them makes their fields vLLM's: a body is
checked with ``vllm run-batch``'s types, defaults and rules, and an answer has every field
of ``run-batch``'s (``stop_reason``, ``logprobs``, and whatever a newer vLLM adds).

vLLM 0.26 (the GPU host) and 0.32 (the CPU build) both keep these models in
``vllm.entrypoints.openai.chat_completion.protocol``, earlier releases in
``vllm.entrypoints.openai.protocol``. The batch envelope's own models (``BatchRequestInput``,
``BatchRequestOutput``) moved between those releases (0.32's old path is an alias that warns
when imported, and its new module loads the whole API server), so the envelope's four keys
are written by ``mmbatch.openai_batch.writer`` itself.

vLLM's models are the one part of vLLM used outside the engine adapter (``engine/vllm.py``):
they describe the batch format, which both its reader and its writer (this package's
``reader`` and ``writer``) need, and they start no engine. vLLM is imported on first use (it
takes seconds), never when this module is.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from mmbatch.types import Choice, Result, TokenLogprob
from mmbatch.validation import TYPE_ERRORS, expected, problems

PROTOCOL_MODULES = (
    "vllm.entrypoints.openai.chat_completion.protocol",
    "vllm.entrypoints.openai.protocol",
)
"""Where vLLM keeps its chat completion models: the first in every supported release (0.26
through 0.32), the second in releases before them."""

MISSING_LOGPROB = -9999.0
"""The least log probability vLLM's OpenAI server writes (its stand-in for none)."""


@functools.cache
def protocol() -> ModuleType:
    """vLLM's module of chat completion models, found where the installed vLLM keeps it."""
    for name in PROTOCOL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == "vllm":
                raise ImportError(
                    "OpenAI batch files are read with vLLM's own models: install vLLM "
                    "(pip install 'mmbatch[gpu]', or 'mmbatch[cpu]' for its CPU build)"
                ) from exc
            continue
        if hasattr(module, "ChatCompletionRequest"):
            return module
    raise ImportError(f"this vLLM has no chat completion models at {', '.join(PROTOCOL_MODULES)}")


class InvalidBody(ValueError):
    """A batch line's body that vLLM's ``ChatCompletionRequest`` refuses, said in one line."""


@dataclass(frozen=True)
class CheckedBody:
    """A batch line's body as vLLM's ``ChatCompletionRequest`` reads it."""

    values: Mapping[str, Any]
    """Every field vLLM's model has, validated (``"0.5"`` is 0.5), its default where unset."""
    changed: frozenset[str]
    """The fields the body sets to something other than vLLM's default."""
    unknown: tuple[str, ...]
    """Keys vLLM's model does not have (vLLM ignores them)."""


def check_chat_body(body: Mapping[str, Any]) -> CheckedBody:
    """``body`` read by vLLM's ``ChatCompletionRequest``, except its ``messages`` (the caller
    reads them: where a line's pictures may come from is mmbatch's rule, not vLLM's);
    ``InvalidBody`` names what vLLM refuses in it."""
    model = protocol().ChatCompletionRequest
    try:
        request = model.model_validate({**body, "messages": []})
    except Exception as exc:  # pydantic's ValidationError, or vLLM's own checks' error
        raise InvalidBody(_problem(exc, model, body)) from None
    values = vars(request)  # by field, without touching the deprecated ``max_tokens``
    defaults = _defaults(model)
    changed = frozenset(
        name
        for name in request.model_fields_set & body.keys()  # not those vLLM's checks set
        if name in defaults and values[name] != defaults[name]
    )
    return CheckedBody(values, changed, tuple(request.model_extra or ()))


@functools.cache
def _defaults(model: type[Any]) -> dict[str, Any]:
    """What ``model`` holds for each field left out (a default made by a factory, made once:
    a random ``request_id`` is then never the default, which is as good as any)."""
    return {
        name: field.get_default(call_default_factory=True)
        for name, field in model.model_fields.items()
    }


def _problem(exc: Exception, model: Any, body: Mapping[str, Any]) -> str:
    """What vLLM's model refuses in ``body``, in one line: a value of the wrong type said with
    its field's type (``temperature must be a number, got 'warm'``), anything else in vLLM's
    or pydantic's words."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    first = problems(errors())[0]
    field = first.loc[0] if first.loc else ""
    if isinstance(field, str) and field in model.model_fields and first.kind in TYPE_ERRORS:
        kind = expected(model.model_fields[field].annotation)
        return f"{field} must be {kind}, got {body.get(field)!r}"
    where = ".".join(str(p) for p in first.loc if isinstance(p, int) or str(p).isidentifier())
    return f"{where}: {first.message}" if where else first.message


def chat_completion(
    response_id: str, created: int, model: str, result: Result, top_logprobs: int | None
) -> dict[str, Any]:
    """``result`` as vLLM's OpenAI server answers a chat completion (a ``chat.completion``
    object, as JSON data), with each choice's log probabilities when the request asked for
    them (``top_logprobs`` alternatives a token, as vLLM's server lays them out)."""
    p = protocol()
    usage = result.usage
    choices = result.choices or (
        Choice(
            result.text or "",
            result.finish_reason,
            usage.output_tokens,
            result.stop_reason,
            result.logprobs,
        ),
    )
    response = p.ChatCompletionResponse(
        id=response_id,
        created=created,
        model=model,
        choices=[
            p.ChatCompletionResponseChoice(
                index=index,
                message=p.ChatMessage(role="assistant", content=choice.text),
                logprobs=None
                if top_logprobs is None or choice.logprobs is None
                else _logprobs(p, choice.logprobs, top_logprobs),
                finish_reason=choice.finish_reason or "stop",
                stop_reason=choice.stop_reason,
            )
            for index, choice in enumerate(choices)
        ],
        usage=p.UsageInfo(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.output_tokens,
            total_tokens=usage.prompt_tokens + usage.output_tokens,
            prompt_tokens_details={"cached_tokens": usage.cached_tokens},
        ),
    )
    data: dict[str, Any] = response.model_dump(mode="json")
    return data


def _logprobs(p: ModuleType, tokens: Sequence[TokenLogprob], top: int) -> Any:
    """As vLLM's server writes them (``OpenAIServingChat._create_chat_logprobs``): each
    token with the first ``top`` of its step's candidates (the chosen token first; -1: all),
    log probabilities no lower than ``MISSING_LOGPROB``."""
    return p.ChatCompletionLogProbs(
        content=[
            p.ChatCompletionLogProbsContent(
                token=token.token,
                logprob=max(token.logprob, MISSING_LOGPROB),
                bytes=None if token.bytes is None else list(token.bytes),
                top_logprobs=[
                    p.ChatCompletionLogProb(
                        token=other.token,
                        logprob=max(other.logprob, MISSING_LOGPROB),
                        bytes=list(other.token.encode("utf-8", errors="replace")),
                    )
                    for other in (token.candidates if top == -1 else token.candidates[:top])
                ],
            )
            for token in tokens
        ]
    )
