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
from mmbatch.errors import FatalEngineError, MmbatchError
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
        engine = start_engine(config, media_per_prompt)
        _ENGINES[key] = engine
    return engine


def forget(engine: VLLMEngine) -> None:
    """Drop ``engine`` from this process's engines (it is closing): the next ask builds
    another."""
    for key, kept in list(_ENGINES.items()):
        if kept is engine:
            del _ENGINES[key]


def start_engine(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> VLLMEngine:
    """A new engine for ``config``, its settings checked first (``ConfigError``, one line,
    before any model is loaded); an engine that fails to start anyway is a
    ``FatalEngineError`` saying why, not a traceback."""
    import os
    import sys

    from mmbatch.engine.logs import engine_log
    from mmbatch.engine.vllm import VLLMEngine, preflight

    log = config.log_file
    with engine_log(None if log is None else os.devnull):  # a mistake leaves no log file
        preflight(config, media_per_prompt)
    if log is not None:
        print(f"mmbatch: starting vLLM; its log goes to {log} (-v: here)", file=sys.stderr)
    try:
        with engine_log(log):
            return VLLMEngine(config, media_per_prompt)
    except MmbatchError:
        raise
    except Exception as exc:  # vLLM raises anything at start-up (memory, devices, weights)
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        where = f" (its log: {log})" if log is not None else ""
        raise FatalEngineError(f"the vLLM engine did not start{where}: {reason}") from exc


def built_engines() -> int:
    """How many engines this process has built through here (tests check reuse with it)."""
    return len(_ENGINES)
