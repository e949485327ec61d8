"""The prompt budget an engine on a model measures with, for tests of what fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def budget_for(model: Path, max_model_len: int, max_item_tokens: int | None = None) -> Any:
    """The budget an engine on ``model`` with these limits measures with: its chat template,
    vLLM's counts for it."""
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.processor import ChatTemplate
    from mmbatch.engine.vllm_settings import processing_counts

    template = ChatTemplate(str(model), trust_remote_code=False)
    counts = processing_counts(EngineConfig(str(model)), template.render)
    return template.budget(counts, max_model_len, max_item_tokens)
