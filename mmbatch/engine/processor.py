"""The model's Hugging Face processor, loaded once per process.

Two things need it before and beside the engine: a ``caption`` job asks which media the
model takes (to know what a folder walk collects) before the engine starts, and the engine
renders prompts with its chat template and measures them with its resize rules. Loading it
is seconds for a hub model, so it is loaded once and shared.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mmbatch.clock import milestone
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError
from mmbatch.types import Modality, Turn

if TYPE_CHECKING:
    from mmbatch.engine.budget import PromptBudget, TokenCounts

_PARTS: dict[Modality, str] = {
    "image": "image_processor",
    "video": "video_processor",
    "audio": "feature_extractor",
}


@lru_cache(maxsize=4)
def load_processor(model: str, trust_remote_code: bool = False) -> Any:
    """``AutoProcessor.from_pretrained(model)``, once; ``ConfigError`` if it cannot load."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
        raise ConfigError(f"cannot load the processor of {model!r}: {reason}") from exc


def model_modalities(config: EngineConfig) -> frozenset[Modality]:
    """The media the model's processor takes (image, video, audio)."""
    trust = bool(config.engine_kwargs.get("trust_remote_code", False))
    processor = load_processor(config.model, trust)
    return frozenset(m for m, attr in _PARTS.items() if getattr(processor, attr, None) is not None)


class ChatTemplate:
    """Renders (system, prompt, media, earlier turns) with the model's chat template."""

    def __init__(self, model: str, trust_remote_code: bool) -> None:
        self.processor = load_processor(model, trust_remote_code)
        if getattr(self.processor, "chat_template", None) is None:
            raise ConfigError(f"the model {model!r} has no chat template")
        self.render = lru_cache(maxsize=4096)(self._render)

    def _render(
        self,
        system: str | None,
        prompt: str,
        modalities: tuple[str, ...],
        history: tuple[Turn, ...] = (),
    ) -> str:
        messages = chat_messages(system, prompt, modalities, history)
        text = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def budget(
        self, counts: TokenCounts | None, max_model_len: int, max_item_tokens: int | None
    ) -> PromptBudget:
        """The pre-flight budget of an engine with these limits, on this model, its media
        counted by ``counts`` (vLLM's, ``mmbatch.engine.vllm_counts``)."""
        from mmbatch.engine.budget import PromptBudget

        return PromptBudget.from_processor(
            self.processor, self.render, counts, max_model_len, max_item_tokens
        )


class TemplateLoad:
    """The model's chat template (``ChatTemplate``), loaded on a thread of its own from the
    moment this is made, so that an engine's process reads it while ``vllm.LLM`` is built
    (the model's Hugging Face processor and its tokenizer: a second or two for a hub
    model) instead of after; ``template`` waits for it. A load that fails raises its error
    there, where the engine's start reports it.

    The thread loads a processor of its own rather than taking the one vLLM loads: vLLM
    reaches its processor through caches whose keys and helpers change between its
    versions, and its renderer threads use that processor's tokenizer, which is not safe to
    share with ours."""

    def __init__(self, model: str, trust_remote_code: bool) -> None:
        self._model, self._trust = model, trust_remote_code
        self._template: ChatTemplate | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._load, name="mmbatch-template", daemon=True)
        self.thread.start()

    def _load(self) -> None:
        try:
            self._template = ChatTemplate(self._model, self._trust)
        except BaseException as exc:  # raised again by ``template``, in its caller's thread
            self._error = exc
            return
        milestone("template_read")

    def template(self) -> ChatTemplate:
        """The loaded template, once the thread is done; its error if it failed."""
        self.thread.join()
        if self._error is not None:
            raise self._error
        assert self._template is not None
        return self._template


def chat_messages(
    system: str | None,
    prompt: str,
    modalities: Sequence[str],
    history: Sequence[Turn] = (),
) -> list[dict[str, Any]]:
    """The chat messages of one request, as the model's chat template takes them: the
    system prompt, the earlier turns (each user turn with its share of ``modalities``, in
    order), then ``prompt`` with the rest; in each message the media come before the text,
    so that requests sharing a picture share the prefix the prefix cache reuses."""
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
    left = list(modalities)
    for turn in history:
        taken, left = left[: turn.media], left[turn.media :]
        messages.append({"role": turn.role, "content": _content(taken, turn.text)})
    messages.append({"role": "user", "content": _content(left, prompt)})
    return messages


def _content(modalities: Sequence[str], text: str) -> list[dict[str, Any]]:
    return [*({"type": m} for m in modalities), {"type": "text", "text": text}]


def model_is_here(model: str) -> bool:
    """Whether ``model`` can be read without the network: a local folder, or a hub model in
    the local Hugging Face cache."""
    import os

    if os.path.isdir(os.path.expanduser(model)):
        return True
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    except ValueError:  # not a valid hub name either
        return False
