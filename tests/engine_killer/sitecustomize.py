"""A request that kills its engine wherever it is run, as a crash in a kernel on one bad
input would: put this folder on ``PYTHONPATH`` with ``ENGINE_KILLER_PROMPT`` set, and every
Python process started so (a Ray worker, the engine processes it starts) runs vLLM's engine
as it is, except that a request with that prompt ends the process that adds it, at once
(``os._exit``), before vLLM sees it. Without the variable nothing changes."""

from __future__ import annotations

import os

KILLER_EXIT = 71
"""The exit code of a process the request killed."""

_PROMPT = os.environ.get("ENGINE_KILLER_PROMPT")

if _PROMPT:
    from typing import Any

    from mmbatch.engine import vllm

    _add = vllm.VLLMEngine.add

    def _add_or_die(engine: Any, request: Any, media: Any, sampling: Any) -> None:
        if request.request.prompt == _PROMPT:
            os._exit(KILLER_EXIT)
        _add(engine, request, media, sampling)

    vllm.VLLMEngine.add = _add_or_die  # type: ignore[method-assign]
