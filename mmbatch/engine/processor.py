"""The model's Hugging Face processor, loaded once per process.

Two things need it before and beside the engine: a ``caption`` job asks which media the
model takes (to know what a folder walk collects) before the engine starts, and the engine
renders prompts with its chat template and measures them with its resize rules. Loading it
is seconds for a hub model, so it is loaded once and shared.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError
from mmbatch.types import Modality

if TYPE_CHECKING:
    from mmbatch.engine.budget import PromptBudget

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
        raise ConfigError(f"cannot load the processor of {model!r}: {exc}") from exc


def model_modalities(config: EngineConfig) -> frozenset[Modality]:
    """The media the model's processor takes (image, video, audio)."""
    trust = bool(config.engine_kwargs.get("trust_remote_code", False))
    processor = load_processor(config.model, trust)
    return frozenset(m for m, attr in _PARTS.items() if getattr(processor, attr, None) is not None)


class ChatTemplate:
    """Renders (system, prompt, media) with the model's chat template, media first."""

    def __init__(self, model: str, trust_remote_code: bool) -> None:
        self.processor = load_processor(model, trust_remote_code)
        if getattr(self.processor, "chat_template", None) is None:
            raise ConfigError(f"the model {model!r} has no chat template")
        self.render = lru_cache(maxsize=4096)(self._render)

    def _render(self, system: str | None, prompt: str, modalities: tuple[str, ...]) -> str:
        messages: list[dict[str, Any]] = []
        if system is not None:
            messages.append({"role": "system", "content": [{"type": "text", "text": system}]})
        content: list[dict[str, Any]] = [{"type": m} for m in modalities]
        content.append({"type": "text", "text": prompt})
        messages.append({"role": "user", "content": content})
        text = self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def budget(self, max_model_len: int, max_item_tokens: int | None) -> PromptBudget:
        """The pre-flight budget of an engine with these limits, on this model."""
        from mmbatch.engine.budget import PromptBudget

        return PromptBudget.from_processor(
            self.processor, self.render, max_model_len, max_item_tokens
        )
