"""What a vLLM engine is started with, and the checks that read the same settings as vLLM
reads them, without starting an engine: the engine arguments vLLM has, the model found and
fitting the settings (``preflight``), its ``ModelConfig`` and its token counts. A mistake is
one line in the user's words, before any output exists. Each imports vllm when first
called, never at this module's import; the engine itself is ``mmbatch.engine.vllm``."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.vllm_arguments import LLM_ONLY_ARGUMENTS
from mmbatch.errors import ConfigError
from mmbatch.types import MODALITIES, Modality

if TYPE_CHECKING:
    from mmbatch.engine.vllm_counts import ProcessingCounts, Render

DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3
"""The KV cache of an engine on vLLM's CPU build, unless the user sizes it
(``_cpu_kv_cache_default``)."""


@dataclass(frozen=True)
class ModelFacts:
    """What vLLM's own configuration says about the model, read without starting an engine."""

    max_model_len: int
    """The context the engine would run with: ``max_model_len`` if given, else the model's."""
    model_config: Any = dataclasses.field(default=None, compare=False, repr=False)
    """vLLM's ``ModelConfig`` the check made, for what else reads the model with the same
    settings (``processing_counts``): vLLM builds it anew on each ask."""


def check_engine_arguments(engine_kwargs: Mapping[str, Any]) -> None:
    """``ConfigError`` for an argument ``vllm.LLM`` does not have, with the likeliest one
    meant (vLLM itself answers a ``TypeError`` from deep inside, after the job began)."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)} | LLM_ONLY_ARGUMENTS
    for key in engine_kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see `vllm serve --help`"
            raise ConfigError(f"engine argument {key!r}: vLLM has no such argument ({hint})")


def preflight(config: EngineConfig, media_per_prompt: dict[Modality, int]) -> ModelFacts:
    """Check ``config`` as vLLM will read it, without starting an engine: the model can be
    found, every engine argument is one vLLM has and holds a value it takes, and the model
    fits the settings (a ``max_model_len`` within its context). A mistake is a
    ``ConfigError`` of one line naming the bad value and what would be valid. A model folder
    that is not there is said best by ``check_model_name``, which the caller runs first (an
    engine's start: ``mmbatch.engine.builder.read_host``)."""
    check_engine_arguments(config.engine_kwargs)
    try:
        vllm_config = engine_args(config, media_per_prompt).create_engine_config()
    except Exception as exc:  # vLLM checks with pydantic, ValueError, OSError from the hub...
        raise ConfigError(_config_problem(config, exc)) from exc
    model = vllm_config.model_config
    return ModelFacts(max_model_len=int(model.max_model_len), model_config=model)


def model_config(config: EngineConfig) -> Any:
    """vLLM's ``ModelConfig`` of ``config`` (its model as vLLM reads it, with the user's
    settings), without starting an engine; a ``ConfigError`` of one line, as ``preflight``
    gives, for a model or a setting vLLM does not take (its name checked by the caller, as
    for ``preflight``)."""
    check_engine_arguments(config.engine_kwargs)
    try:
        return engine_args(config, None).create_model_config()
    except Exception as exc:  # vLLM checks with pydantic, ValueError, OSError from the hub...
        raise ConfigError(_config_problem(config, exc)) from exc


def processing_counts(
    config: EngineConfig, render: Render, checked: ModelFacts | None = None
) -> ProcessingCounts:
    """The token counts of the model ``config`` names (``mmbatch.engine.vllm_counts``),
    with its engine settings (a user's ``mm_processor_kwargs`` change the counts), without
    starting an engine. ``checked``: what ``preflight`` said of the same ``config``, whose
    ``ModelConfig`` is taken rather than made again (the engine's own counts read its
    engine's, media limits and all, as these do)."""
    from mmbatch.engine.vllm_counts import ProcessingCounts

    made = checked.model_config if checked is not None else None
    return ProcessingCounts(made if made is not None else model_config(config), render)


@dataclass(frozen=True)
class EngineSettings:
    """What an engine is started with: ``vllm.LLM``'s arguments, the threads that render
    its prompts (``VLLMEngine``), and whether vLLM runs here on its CPU build, which other
    defaults follow from (where the engine core runs, torch's threads)."""

    llm_kwargs: Mapping[str, Any]
    render_threads: int
    on_cpu: bool


def engine_settings(
    config: EngineConfig, media_per_prompt: Mapping[Modality, int] | None
) -> EngineSettings:
    """The settings the engine for ``config`` starts with, which the pre-flight check
    (``engine_args``) reads too, so that what is checked is what is started:

    * the user's settings, as given;
    * memory profiled only for the media a job sends (None: vLLM's own default): vLLM
      assumes 999 of any modality left unspecified, which on video-capable models reserves
      room for videos never sent;
    * with several render threads, vLLM's multimodal processor cache off, as it is not
      thread-safe; a user who asked for the cache gets one render thread instead;
    * the CPU build's KV cache default (``_cpu_kv_cache_default``).
    """
    kwargs = config.llm_kwargs()
    if media_per_prompt is not None:
        unsent = dict.fromkeys(MODALITIES, 0)
        kwargs.setdefault("limit_mm_per_prompt", {**unsent, **media_per_prompt})
    render_threads = config.render_threads
    if render_threads > 1:
        if kwargs.get("mm_processor_cache_gb", 0):
            render_threads = 1  # the user asked for the cache, which needs one renderer
        else:
            kwargs["mm_processor_cache_gb"] = 0
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        _cpu_kv_cache_default(kwargs)
    return EngineSettings(kwargs, render_threads, on_cpu)


def engine_args(config: EngineConfig, media_per_prompt: dict[Modality, int] | None) -> Any:
    """``vllm.EngineArgs`` as the engine for ``config`` gets them (``engine_settings``)."""
    from vllm.engine.arg_utils import EngineArgs

    kwargs = engine_settings(config, media_per_prompt).llm_kwargs
    args = {k: v for k, v in kwargs.items() if k not in LLM_ONLY_ARGUMENTS}
    if isinstance(args.get("compilation_config"), int):  # as vllm.LLM reads an int
        args["compilation_config"] = {"mode": args["compilation_config"]}
    return EngineArgs(**args)


def _hub_problem(model: str, exc: OSError) -> str:
    """Why the hub name ``model`` gave no model, in our words: the library's own advice
    (``local_files_only=False``, a token to pass) is about arguments the user never wrote."""
    from huggingface_hub import constants

    missing = f"model {model!r} is not a local folder nor in the Hugging Face cache"
    if constants.HF_HUB_OFFLINE:
        return f"{missing}, and HF_HUB_OFFLINE is set, so the hub was not asked"
    if _unreachable(exc):
        return f"{missing}, and the Hugging Face hub cannot be reached"
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (
        f"model {model!r} is not a local folder, and the Hugging Face hub has no such model: "
        f"{detail}"
    )


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the hub could not be reached, as
    opposed to answering that there is no such model."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (LocalEntryNotFoundError, ConnectionError, TimeoutError)):
            return True
        if "couldn't connect to" in str(seen):  # transformers' words for the same
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _config_problem(config: EngineConfig, exc: Exception) -> str:
    """vLLM's complaint about a configuration, as one line for the user."""
    import pydantic

    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if str(p).isidentifier()]
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        too_long = re.search(
            r"User-specified max_model_len \((\d+)\) is greater than the derived "
            r"max_model_len \((.*?)\)",
            message,
        )
        if too_long:
            return (
                f"max_model_len {too_long[1]} is longer than the context of the model "
                f"{config.model!r} ({too_long[2]}); use at most that, or a model with a "
                "longer context"
            )
        if loc:
            name = ".".join(loc)
            value = first.get("input")
            return f"engine argument {name}={value!r}: {message}"
        return f"vLLM refuses the engine settings: {message}"
    if isinstance(exc, OSError):
        return _hub_problem(config.model, exc)
    lines = str(exc).strip().splitlines()
    return f"vLLM refuses the engine settings: {type(exc).__name__}: {lines[0] if lines else ''}"


def _cpu_kv_cache_default(kwargs: dict[str, Any]) -> None:
    """For vLLM's CPU build, size the KV cache instead of reserving 92% of RAM.

    The CPU backend reads ``gpu_memory_utilization`` as the share of the machine's memory
    to reserve, and refuses to start when that much is not free: any other process running
    made a laptop or CI machine fail at start-up. A fixed 4 GiB KV cache is plenty for batch
    captioning on a CPU; an explicit setting (argument or VLLM_CPU_KVCACHE_SPACE) wins.
    """
    import os

    chosen = {"kv_cache_memory_bytes", "gpu_memory_utilization"} & kwargs.keys()
    if not chosen and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        kwargs["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
