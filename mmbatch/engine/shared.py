"""One engine per process and configuration, built on first use and kept.

Callers that cannot hold an engine themselves (a ``Dataset.map`` function, which is pickled
and must stay small) ask here instead: the first call in a process builds the engine, every
later call with the same settings gets the same one, since building it again would cost the
model load and the GPU memory a second time.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mmbatch.engine.config import EngineConfig
from mmbatch.types import Modality

if TYPE_CHECKING:
    from mmbatch.engine.vllm import VLLMEngine

_ENGINES: dict[str, VLLMEngine] = {}


def shared_engine(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> VLLMEngine:
    """This process's engine for ``config``, built now if it is the first ask."""
    key = json.dumps(
        [config.llm_kwargs(), sorted(media_per_prompt.items())], sort_keys=True, default=repr
    )
    engine = _ENGINES.get(key)
    if engine is None:
        from mmbatch.engine.vllm import VLLMEngine

        engine = VLLMEngine(config, media_per_prompt)
        _ENGINES[key] = engine
    return engine


def built_engines() -> int:
    """How many engines this process has built through here (tests check reuse with it)."""
    return len(_ENGINES)
