"""OpenAI batch output lines: the row shape of ``mmbatch run-openai-batch``.

Each line is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error": null}``, the body a ``chat.completion`` written by vLLM's own response model
(``openai_batch.vllm_protocol``), with every field of ``vllm run-batch``'s: choices with
``finish_reason``, ``stop_reason`` and, when the line asked, ``logprobs``; usage with cached
prompt tokens. For a request that failed, the body is ``{"error": {...}}`` with status 400
(the request or its media were bad) or 500 (the engine failed it), as the hosted batch API
writes it. The error object is OpenAI's (``message``, ``type``, ``param``, ``code``: the
failure's kind) plus the ``stage`` that failed, so that reading a line back (resume, the
summary, the gallery) loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import xxhash

from mmbatch.output.rows import Asked, Row
from mmbatch.types import FailureKind, ItemError, Request, Result, Stage, Usage

_CLIENT_ERROR_STAGES: frozenset[Stage] = frozenset({"source", "load", "decode", "validate"})


class OpenAIBatchShape:
    """Rows as OpenAI batch output lines, keyed by ``custom_id``."""

    def __init__(self, model: str) -> None:
        self.model = model

    def builder(self, requests: Sequence[Request]) -> OpenAIBatchShape:
        return self

    def row_id(self, row: Mapping[str, Any]) -> str:
        return str(row["custom_id"])

    def is_row(self, row: Mapping[str, Any]) -> bool:
        return {"custom_id", "response", "error"} <= row.keys() and isinstance(
            row["response"], Mapping
        )

    def asked(self, row: Mapping[str, Any]) -> Asked | None:
        """An OpenAI batch output line does not record its request's messages."""
        return None

    def outcome(self, row: Mapping[str, Any]) -> Result:
        response = row["response"]
        body = response.get("body") or {}
        if response.get("status_code") == 200:
            usage = body.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            counts = Usage(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                int(details.get("cached_tokens") or 0),
            )
            return Result(self.row_id(row), usage=counts)
        error = body.get("error") or {}
        client = error.get("type") == "invalid_request_error"
        stage = cast(Stage, str(error.get("stage") or ("validate" if client else "engine")))
        kind = cast(FailureKind, str(error.get("code") or "other"))
        return Result(self.row_id(row), error=ItemError(stage, str(error.get("message")), kind))

    def add(self, request: Request, media_keys: tuple[str, ...], result: Result) -> Row:
        if result.error is not None:
            return Row(result, error_line(request.id, result))
        from mmbatch.openai_batch.vllm_protocol import chat_completion

        logprobs = request.sampling.logprobs if request.sampling is not None else None
        body = chat_completion(
            f"chatcmpl-{_digest(request.id)}", int(time.time()), self.model, result, logprobs
        )
        return Row(result, _line(request.id, 200, body))


def error_line(custom_id: str, result: Result) -> dict[str, Any]:
    """The output line of a request that failed: 400 for bad input, 500 for the engine."""
    assert result.error is not None
    client = result.error.stage in _CLIENT_ERROR_STAGES
    body = {
        "error": {
            "message": result.error.message,
            "type": "invalid_request_error" if client else "server_error",
            "param": None,
            "code": result.error.kind,
            "stage": result.error.stage,
        }
    }
    return _line(custom_id, 400 if client else 500, body)


def _line(custom_id: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    digest = _digest(custom_id)
    return {
        "id": f"batch_req_{digest}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": f"req_{digest}", "body": body},
        "error": None,
    }


def _digest(custom_id: str) -> str:
    """A stable id per custom_id, so a rerun writes the same ids. A custom_id need not be
    valid Unicode (JSON's ``"\\udc80"`` escape reads as a lone surrogate): it is kept as
    it came, hashed by its code points, and written back with the same escape
    (``mmbatch.jsonl.encode_line``), so that the caller finds it again."""
    return xxhash.xxh3_64_hexdigest(custom_id.encode("utf-8", "surrogatepass"))
