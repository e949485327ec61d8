"""What a recipe's [engine] table may set: vLLM settings that name no code and no file.

A recipe is shared like a document, so its [engine] table is data. vLLM reads many of its
settings as names of things to load: a module to import (``compilation_config``'s
``inductor_passes`` and ``backend``, ``worker_cls``, ``logits_processors``), a file to read
(``chat_template``, ``tokenizer``, ``download_dir``), or a config that does both
(``hf_overrides`` with an ``auto_map``, ``mm_processor_kwargs`` with ``trust_remote_code``).
So a recipe may set only the settings listed in ``ENGINE_SETTINGS``, each with the shape
its value must have: numbers, sizes, true/false, and strings only where they are one of a
fixed set of choices (a dtype, a structured-outputs backend) or a plain name that vLLM looks
up in a table of its own (a quantization method): never a path, a URL or a dotted module
name. Nested tables (``compilation_config``, ``limit_mm_per_prompt``,
``mm_processor_kwargs``, ...) list their own keys the same way.

Everything else is refused when the recipe is read, before any vLLM code runs (``mmbatch
check`` imports nothing a recipe names), with a line that names the key and says how to set
it on the command line (``--engine-arg KEY=VALUE``), where the person running the job
chooses it; a key that is none of vLLM's settings (as the installed vLLM's source declares
them: ``mmbatch.engine.vllm_arguments``) gets the setting it likely misspells instead. The
command line and a Python caller's own ``EngineConfig`` are not restricted.

What a recipe may start: the engine of the job, as processes of this machine talking over
local pipes and sockets (``distributed_executor_backend`` ``"mp"`` or ``"uni"``, or
``"external_launcher"``, which starts nothing and joins the processes a launcher such as
``torchrun`` started). Never a cluster: ``"ray"`` starts a local Ray cluster whose daemons
(its control store, a raylet, a dashboard) listen on the network, so a shared recipe could
open ports on every machine it runs on; the person running the job may still ask for it on
the command line. Numbers are finite: ``nan`` and ``inf`` are refused.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mmbatch.types import MODALITIES
from mmbatch.validation import LISTED_AT_MOST

Problem = tuple[str, str, bool]
"""``(key path, why, refused)``: ``refused`` when the command line could set it (a key or
a value a recipe may not hold), not when the value is malformed for any caller."""


class Shape(Protocol):
    """What one setting's value may be."""

    def problems(self, value: Any, path: str) -> Iterator[Problem]: ...


@dataclass(frozen=True)
class Number:
    """An integer (``integer``), or any finite number; never true/false, never a string,
    never NaN or infinity (TOML has both; no setting means them)."""

    integer: bool = False

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        kinds = (int,) if self.integer else (int, float)
        what = "an integer" if self.integer else "a finite number"
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
            yield path, f"must be {what}, got {value!r}", False


@dataclass(frozen=True)
class Flag:
    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if not isinstance(value, bool):
            yield path, f"must be true or false, got {value!r}", False


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of strings: names vLLM knows, never a path or a module."""

    choices: tuple[str, ...]

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if value not in self.choices:
            listed = ", ".join(map(repr, self.choices))
            yield path, f"a recipe may set one of {listed}, not {value!r}", True


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Name:
    """A plain name (letters, digits, ``_``, ``-``) that vLLM looks up in a table of its own
    and refuses when it is not there; no dot or slash, so never a module or a path."""

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if not isinstance(value, str) or not _PLAIN_NAME.match(value):
            why = f"must be a plain name (letters, digits, '_', '-'), not {value!r}"
            yield path, why, True


@dataclass(frozen=True)
class ListOf:
    item: Shape

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if not isinstance(value, list):
            yield path, f"must be a list, got {value!r}", False
            return
        for i, each in enumerate(value):
            yield from self.item.problems(each, f"{path}[{i}]")


@dataclass(frozen=True)
class Table:
    """A table whose keys are each listed with their own shape."""

    keys: Mapping[str, Shape]

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if not isinstance(value, Mapping):
            yield path, f"must be a table, got {value!r}", False
            return
        for key, item in value.items():
            shape = self.keys.get(str(key))
            if shape is None:
                yield f"{path}.{key}", _not_settable(str(key), self.keys, path), True
            else:
                yield from shape.problems(item, f"{path}.{key}")


@dataclass(frozen=True)
class TableOf:
    """A table whose keys are ``keys`` (media kinds) and whose values all have one shape."""

    keys: tuple[str, ...]
    values: Shape

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if not isinstance(value, Mapping):
            yield path, f"must be a table, got {value!r}", False
            return
        for key, item in value.items():
            if key not in self.keys:
                yield f"{path}.{key}", f"must be one of {', '.join(self.keys)}", False
            else:
                yield from self.values.problems(item, f"{path}.{key}")


@dataclass(frozen=True)
class Either:
    """Any one of ``shapes`` (tried in order; the last one's problems are reported)."""

    shapes: tuple[Shape, ...]

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        found: list[Problem] = []
        for shape in self.shapes:
            found = list(shape.problems(value, path))
            if not found:
                return
        yield from found


@dataclass(frozen=True)
class ModelName:
    """``model``: the model the recipe was written for (a hub name or a folder), the one
    file a recipe names; ``--model`` replaces it, and its code runs only with
    ``--trust-remote-code``."""

    def problems(self, value: Any, path: str) -> Iterator[Problem]:
        if not isinstance(value, str) or not value:
            yield path, f"must be a model name, got {value!r}", False


def _not_settable(key: str, known: Mapping[str, Shape], table: str = "") -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = f" in {table} (it takes {', '.join(known)})" if table else ""
    return f"not a setting a recipe may set{where}{hint}"


INTEGER = Number(integer=True)
NUMBER = Number()
FLAG = Flag()
_SIZE = Table(
    dict.fromkeys(
        ("shortest_edge", "longest_edge", "height", "width", "min_pixels", "max_pixels"), INTEGER
    )
)
_GENERATION_DEFAULTS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_new_tokens",
)
# What the models' processors take (Qwen-VL, InternVL, Phi, Idefics, Gemma 3, MiniCPM-V,
# Llama 4, Qwen-Omni, ...): numbers, flags and size tables, nothing to load.
_PROCESSOR_NUMBERS = (
    "min_pixels",
    "max_pixels",
    "num_frames",
    "min_frames",
    "max_frames",
    "max_dynamic_patch",
    "min_dynamic_patch",
    "num_crops",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "max_slice_nums",
    "max_patches",
    "max_image_tiles",
)
_PROCESSOR_FLAGS = (
    "do_sample_frames",
    "dynamic_image_size",
    "use_thumbnail",
    "dynamic_hd",
    "do_image_splitting",
    "do_pan_and_scan",
    "use_image_id",
    "use_audio_in_video",
)

ENGINE_SETTINGS: Mapping[str, Shape] = {
    "model": ModelName(),
    "trust_remote_code": FLAG,  # false only: see engine_problems
    "revision": Name(),
    # Numbers and precision
    "dtype": OneOf(("auto", "half", "float16", "bfloat16", "float", "float32")),
    "kv_cache_dtype": OneOf(
        ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
    ),
    "quantization": Name(),  # vLLM's table of methods (a name it lacks is refused there)
    "seed": INTEGER,
    # Sizes and limits
    "max_model_len": INTEGER,
    "max_num_seqs": INTEGER,
    "max_num_batched_tokens": INTEGER,
    "max_logprobs": INTEGER,
    "long_prefill_token_threshold": INTEGER,
    "gpu_memory_utilization": NUMBER,
    "kv_cache_memory_bytes": INTEGER,
    "num_gpu_blocks_override": INTEGER,
    "cpu_offload_gb": NUMBER,
    "block_size": INTEGER,
    # Parallelism
    "tensor_parallel_size": INTEGER,
    "pipeline_parallel_size": INTEGER,
    "data_parallel_size": INTEGER,
    "enable_expert_parallel": FLAG,
    # Not "ray": it starts a Ray cluster, daemons listening on the network (see above).
    "distributed_executor_backend": OneOf(("mp", "uni", "external_launcher")),
    # Scheduling and caching
    "enforce_eager": FLAG,
    "enable_prefix_caching": FLAG,
    "enable_chunked_prefill": FLAG,
    "disable_chunked_mm_input": FLAG,
    "async_scheduling": FLAG,
    "scheduling_policy": OneOf(("fcfs", "priority")),
    "disable_sliding_window": FLAG,
    "disable_cascade_attn": FLAG,
    "optimization_level": INTEGER,
    "performance_mode": OneOf(("balanced", "interactivity", "throughput")),
    "logprobs_mode": OneOf(
        ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
    ),
    "compilation_config": Either(
        (
            INTEGER,  # the mode, as vllm.LLM reads an int
            Table(
                {
                    "mode": Either(
                        (
                            INTEGER,
                            OneOf(
                                ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
                            ),
                        )
                    ),
                    "cudagraph_mode": OneOf(
                        ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
                    ),
                    "cudagraph_capture_sizes": ListOf(INTEGER),
                    "max_cudagraph_capture_size": INTEGER,
                    "cudagraph_num_of_warmups": INTEGER,
                    "compile_sizes": ListOf(INTEGER),
                    "compile_mm_encoder": FLAG,
                    "cudagraph_mm_encoder": FLAG,
                    "use_inductor_graph_partition": FLAG,
                }
            ),
        )
    ),
    # Model loading: formats that read the model's own weight files, none that name another
    "load_format": OneOf(("auto", "hf", "safetensors", "pt", "fastsafetensors", "dummy")),
    "tokenizer_mode": OneOf(("auto", "hf", "mistral")),
    "model_impl": OneOf(("auto", "vllm", "transformers")),
    "generation_config": OneOf(("auto", "vllm")),  # not a folder
    "override_generation_config": Table(dict.fromkeys(_GENERATION_DEFAULTS, NUMBER)),
    "structured_outputs_config": Table(
        {
            "backend": OneOf(("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")),
            "disable_any_whitespace": FLAG,
            "disable_additional_properties": FLAG,
        }
    ),
    # Multimodal
    "limit_mm_per_prompt": TableOf(
        MODALITIES,
        Either(
            (
                INTEGER,
                Table(dict.fromkeys(("count", "width", "height", "num_frames", "length"), INTEGER)),
            )
        ),
    ),
    "mm_processor_kwargs": Table(
        {
            **dict.fromkeys(_PROCESSOR_NUMBERS, INTEGER),
            "fps": NUMBER,
            "size": _SIZE,
            "max_image_size": _SIZE,
            **dict.fromkeys(_PROCESSOR_FLAGS, FLAG),
        }
    ),
    "media_io_kwargs": TableOf(MODALITIES, Table({"num_frames": INTEGER, "fps": NUMBER})),
    "mm_processor_cache_gb": NUMBER,
    "mm_processor_cache_type": OneOf(("lru", "shm")),
    "mm_shm_cache_max_object_size_mb": INTEGER,
    "mm_encoder_tp_mode": OneOf(("weights", "data")),
    "skip_mm_profiling": FLAG,
}
"""Every [engine] setting a recipe may hold, with the shape of its value."""

HOW = "pass it on the command line instead: --engine-arg {key}=VALUE"


def engine_problems(engine: Mapping[str, Any]) -> list[str]:
    """One line per setting of a recipe's [engine] table that a recipe may not hold (or
    whose value has the wrong shape); empty when every one is allowed."""
    lines = []
    if engine.get("trust_remote_code"):
        lines.append(
            "[engine] trust_remote_code = true: a recipe cannot allow a model's own Python code "
            "to run; pass --trust-remote-code to the command to allow it"
        )
    unknown = 0
    for key, value in engine.items():
        if key == "trust_remote_code" and value is True:
            continue
        shape = ENGINE_SETTINGS.get(key)
        if shape is None:
            # Only the keys a message lists are looked up among vLLM's settings (a hundred
            # thousand misspellings would take minutes); the rest are only counted there.
            unknown += 1
            said = _unknown_key(key) if unknown <= LISTED_AT_MOST else f"{key}: unknown"
            lines.append(f"[engine] {said}")
            continue
        for path, why, refused in shape.problems(value, key):
            how = f"; {HOW.format(key=key)}" if refused else ""
            lines.append(f"[engine] {path}: {why}{how}")
    return lines


def _unknown_key(key: str) -> str:
    """Why the [engine] table may not hold ``key``, and what to do: pass it on the command
    line if it is one of vLLM's settings, else use the setting it likely misspells."""
    from mmbatch.engine.vllm_arguments import engine_argument_names

    vllms = engine_argument_names()
    if vllms is None or key in vllms:  # vLLM's (or vLLM is not here to ask)
        return f"{key}: {_not_settable(key, ENGINE_SETTINGS)}; {HOW.format(key=key)}"
    settable = difflib.get_close_matches(key, sorted(ENGINE_SETTINGS), n=1)
    if settable:
        return f"{key}: not a vLLM engine setting (did you mean {settable[0]!r}?)"
    close = difflib.get_close_matches(key, sorted(vllms), n=1)
    if close:
        return (
            f"{key}: not a vLLM engine setting (did you mean {close[0]!r}? a recipe may not "
            f"set it; {HOW.format(key=close[0])})"
        )
    return f"{key}: not a vLLM engine setting (see `vllm serve --help`)"
