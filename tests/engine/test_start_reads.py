"""What an engine's start reads of the model, and when, with the real tiny model (no engine
is built: vLLM's ``LLM`` is stopped at its door).

* The job's own process, while its engine processes start, checks the settings, reads the
  chat template and vLLM's token counts with one vLLM ``ModelConfig``: the one the check
  made, not one made again.
* An engine's process reads its chat template while ``vllm.LLM`` is built, not after: the
  template's load is under way before the build goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mmbatch.engine.config import EngineConfig

TEMPLATE_WAIT = 60.0
"""Seconds ``LLM`` waits for the template's load to begin (a serial start never begins it)."""


class _Stopped(Exception):
    """Raised where ``vllm.LLM`` would build the engine."""


def test_the_job_reads_the_model_config_once_for_its_checks_and_counts(
    tiny_vl_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.engine.arg_utils import EngineArgs

    from mmbatch.engine.builder import check_then_read

    made: list[object] = []
    real = EngineArgs.create_model_config

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(config := real(self, *args, **kwargs))
        return config

    monkeypatch.setattr(EngineArgs, "create_model_config", counted)
    template, counts = check_then_read(EngineConfig(str(tiny_vl_model)), {"image": 1})
    assert len(made) == 1, f"vLLM's ModelConfig made {len(made)} times"
    # The counts are read as ever: a picture's tokens, measured in the template.
    assert counts.modalities >= {"image"}
    image = counts.image(64, 48)
    assert image is not None
    assert image.tokens > 0
    assert "Describe" in template.render(None, "Describe this.", ("image",))


def test_an_engine_reads_its_chat_template_while_vllm_builds_it(
    tiny_vl_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.entrypoints.llm import LLM

    from mmbatch.engine import processor
    from mmbatch.engine.vllm import VLLMEngine

    begun, done = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}
    real_template: Callable[..., None] = processor.ChatTemplate.__init__

    def template_spy(self: Any, *args: Any, **kwargs: Any) -> None:
        seen["template_thread"] = threading.current_thread()
        begun.set()
        try:
            real_template(self, *args, **kwargs)
        finally:
            done.set()

    def llm_spy(self: Any, *args: Any, **kwargs: Any) -> None:
        seen["llm_thread"] = threading.current_thread()
        seen["begun_during_build"] = begun.wait(TEMPLATE_WAIT)
        raise _Stopped

    monkeypatch.setattr(processor.ChatTemplate, "__init__", template_spy)
    monkeypatch.setattr(LLM, "__init__", llm_spy)
    with pytest.raises(_Stopped):
        VLLMEngine(EngineConfig(str(tiny_vl_model)), {"image": 1})
    assert seen["begun_during_build"], "the chat template was not read while LLM was built"
    assert seen["template_thread"] is not seen["llm_thread"]
    assert done.wait(TEMPLATE_WAIT)  # its thread done, before the spies go
