"""Which model to run and how: the settings of the engine, validated where they are made.

``EngineConfig.engine_kwargs`` is handed to ``vllm.LLM`` untouched: mmbatch does not
re-declare vLLM's options, it only fills in a few defaults the job needs (metrics on,
encoder data-parallel mode under tensor parallelism) that the user can still override.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mmbatch.errors import ConfigError

DEFAULT_RENDER_THREADS = 1
"""One background renderer: overlaps preprocessing with the engine, keeps the processor cache."""


@dataclass(frozen=True)
class EngineConfig:
    """Which model to run and the keyword arguments for ``vllm.LLM``."""

    model: str
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    log_file: str | None = None
    """Where vLLM's log goes once the engine starts (``mmbatch.engine.logs``); None: where
    vLLM sends it (the terminal)."""
    log_shown_by: str = "vllm_log=None"
    """How a user of the face that made this config sends vLLM's log to the terminal instead
    of ``log_file``, said beside the file's name: ``-v`` on the command line, the default
    ``vllm_log=None`` from Python."""
    gpus: int | None = None
    """How many of the visible GPUs to use (None: all); how they run the model is chosen
    by ``mmbatch.engine.layout``."""
    engines_per_gpu: int | None = None
    """Engines sharing each GPU, each in a process of its own (None: the layout's default;
    see ``mmbatch.engine.layout``): more than one when vLLM's one-thread engine core, not
    the GPU, is what bounds a small model."""
    render_threads: int = DEFAULT_RENDER_THREADS
    """Threads that run vLLM's host-side preprocessing (the chat template's tokens, the HF
    image processor) beside each engine's loop (``VLLMEngine``): 0 renders on the loop's own
    thread; more than one renders in parallel with vLLM's multimodal processor cache off."""
    batch_invariant: bool = False
    """Answers that do not depend on what they were batched with (vLLM's
    ``VLLM_BATCH_INVARIANT=1``; see ``mmbatch.engine.invariance`` for the guarantee, its
    limits and the GPUs that give it): a resumed or Ray job writes the texts an uninterrupted
    local run writes. Refused where the platform lacks it."""
    log_shown: str | None = None
    """Where the person running the job will find vLLM's log, when not at ``log_file``: an
    output in storage has it written in a temporary folder and uploaded beside the output,
    to this URL, when the job ends."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("a model is required (a local directory or a hub name)")
        if self.gpus is not None and self.gpus < 1:
            raise ConfigError(f"gpus must be >= 1, got {self.gpus}")
        if self.engines_per_gpu is not None and self.engines_per_gpu < 1:
            raise ConfigError(f"engines_per_gpu must be >= 1, got {self.engines_per_gpu}")
        if self.render_threads < 0:
            raise ConfigError(f"render_threads must be >= 0, got {self.render_threads}")
        if "model" in self.engine_kwargs:
            raise ConfigError("pass the model as EngineConfig.model, not as an engine argument")

    def llm_kwargs(self) -> dict[str, Any]:
        """Arguments for ``vllm.LLM``: the user's, over the few defaults mmbatch relies on."""
        kwargs: dict[str, Any] = {
            # The summary's cache hit rates come from llm.get_metrics(), which needs stats on.
            "disable_log_stats": False,
            "enable_prefix_caching": True,
            # A model repository's own Python runs only when the user asks for it
            # (--trust-remote-code): a hub name is not a reason to execute its code.
            "trust_remote_code": False,
        }
        if int(self.engine_kwargs.get("tensor_parallel_size", 1)) > 1:
            # Shard the vision encoder by data, not weights: it is small, and all-reduces
            # across GPUs cost more than they save for it.
            kwargs["mm_encoder_tp_mode"] = "data"
        kwargs.update(self.engine_kwargs)
        kwargs["model"] = self.model
        return kwargs


def parse_engine_args(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` pairs from the command line; values are JSON when they parse as JSON.

    ``max_model_len=2048`` gives an int, ``enforce_eager=true`` a bool,
    ``limit_mm_per_prompt={"image":1}`` a dict, and ``dtype=float32`` stays a string.
    """
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"engine argument {pair!r} is not KEY=VALUE")
        try:
            parsed[key] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key] = raw
    return parsed


def check_model_name(model: str) -> None:
    """A ``ConfigError`` for a model named by a path that holds no model; hub names (one
    ``/`` at most, no leading ``.`` or ``/``) are left to the hub."""
    path = os.path.expanduser(model)
    looks_like_path = path.startswith(("/", ".", "~")) or path.count("/") > 1
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ConfigError(f"model {model!r}: the folder holds no model (no config.json)")
    elif os.path.exists(path):
        raise ConfigError(f"model {model!r} is a file; name the model's folder")
    elif looks_like_path:
        raise ConfigError(
            f"model {model!r}: no such model folder (a hub model is named like "
            "'Qwen/Qwen2.5-VL-3B-Instruct')"
        )
