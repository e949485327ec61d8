"""How a host's GPUs run a model: one engine per GPU when the model fits one (or several per
GPU, when asked), else the smallest tensor-parallel group that fits, replicated over the GPUs
left.

A 7B vision model takes 16 GiB of an H200's 139: two engines on two GPUs do about twice one
GPU's work, where tensor parallelism over both adds all-reduces to every layer for little
gain. So replicas come first; a model too large for one GPU gets the fewest GPUs that hold
it (its vision encoder then runs data-parallel, ``mm_encoder_tp_mode="data"``, set by
``EngineConfig``), and as many such groups as the GPUs allow. An explicit
``tensor_parallel_size`` or GPU count is obeyed as given. The layout says why it was chosen,
and the job's summary repeats it.

Several engines on one GPU (``EngineConfig.engines_per_gpu``) answer a different bound: vLLM's
engine core is one Python thread that schedules, launches and collects every step, and with
a small model on a large GPU that thread, not the GPU, sets the pace. Each engine then gets
its share of the GPU's memory (``gpu_memory_utilization`` divided among them) and a KV cache
of a fixed size (``kv_cache_memory_bytes``): vLLM sizes its cache by profiling the whole
device's free memory, which engines starting beside each other would each count as theirs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mmbatch.engine.config import EngineConfig
from mmbatch.errors import ConfigError
from mmbatch.words import counted

VLLM_MEMORY_SHARE = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of a GPU its engines may take."""
ACTIVATION_RESERVE = 6 * 1024**3
"""Bytes each engine sharing a GPU keeps beside its weights and KV cache, at the least: the
activations of its largest step (the vision encoder's and the language model's), CUDA
graphs, the CUDA context and the allocator's slack. Half the weights' size, if more."""
DEFAULT_ENGINES_PER_GPU = 2
"""Engines per GPU when the user does not say, for a job that fills more than one
(``ONE_ENGINE_REQUESTS``). With one engine, its engine-core thread is the bound and the GPU
waits; a second engine makes the GPU the bound, so a third adds nothing. A second engine's
start costs a small job more than it gains. One engine with decode graphs
(``uncompiled_settings``), faster on distinct pictures, starts later and is slower with
several prompts a picture: two engines stay. The measurements:
``docs/pages/performance.md#engines-per-gpu``."""
ONE_ENGINE_REQUESTS = 1024
"""Requests one engine runs at once (vLLM's ``max_num_seqs`` on a large GPU): a job with
more gets ``DEFAULT_ENGINES_PER_GPU`` engines on each GPU, a smaller one a single engine."""
DECODE_GRAPHS_UP_TO = 1024
"""The largest decode batch a lone engine captures a CUDA graph for: vLLM's ``max_num_seqs``
on a large GPU, the most an engine runs at once."""
COMPILE_SETTINGS = ("enforce_eager", "compilation_config")
"""Engine settings by which a user decides compilation: set, the layout leaves it to them."""
WEIGHTS_SHARE = 0.5
"""The most of a GPU's memory the weights may take: the rest holds the KV cache, the
activations and the encoder cache, without which a batch job runs starved."""
GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    """A visible GPU: its ``CUDA_VISIBLE_DEVICES`` name and its memory in bytes."""

    name: str
    memory: int
    capability: tuple[int, int] | None = None
    """Its CUDA compute capability, ``(9, 0)`` for an H100 or H200 (None: not known)."""


@dataclass(frozen=True)
class Layout:
    """The engines to start: a device group each (empty: the CPU), and why."""

    tensor_parallel: int
    groups: tuple[tuple[str, ...], ...]
    reason: str
    per_gpu: int = 1
    """Engines sharing each GPU (each group appears this many times in ``groups``)."""
    kv_cache_bytes: int | None = None
    """Each engine's KV cache when GPUs are shared (``per_gpu`` > 1): set, not profiled."""
    uncompiled: bool = False
    """The engines start without torch.compile (``uncompiled_settings``): the layout's
    choice wherever the user left compilation to vLLM."""
    requests_per_engine: int | None = None
    """The job's requests per engine (None: unknown), which size a lone engine's graphs."""
    kept: bool = False
    """The engines were started for an earlier job of this process, and kept for this one
    (``mmbatch.engine.registry``)."""

    @property
    def replicas(self) -> int:
        return len(self.groups)

    def engine_kwargs(self, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``engine_kwargs`` for each engine of this layout: with GPUs shared, each engine's
        share of the GPU's memory and its fixed KV cache (unless the user set one); a
        ``gpu_memory_utilization`` given is the GPU's, for all its engines together."""
        kwargs = dict(engine_kwargs)
        if self.per_gpu > 1 and any(self.groups):
            share = float(kwargs.get("gpu_memory_utilization", VLLM_MEMORY_SHARE))
            kwargs["gpu_memory_utilization"] = share / self.per_gpu
            if self.kv_cache_bytes is not None:
                kwargs.setdefault("kv_cache_memory_bytes", self.kv_cache_bytes)
        if self.uncompiled:  # only where the user left compilation to vLLM (_uncompiled)
            for key, value in uncompiled_settings(self).items():
                kwargs.setdefault(key, value)
        return kwargs

    def devices(self) -> list[str | None]:
        """Each replica's ``CUDA_VISIBLE_DEVICES`` (None: leave the environment alone)."""
        return [",".join(group) or None for group in self.groups]

    def plainly(self) -> str:
        """The engines in a user's words (``1 engine on the CPU; starts without compiling``);
        ``describe`` says why, for ``-v`` and the summary."""
        engines = counted(self.replicas, "engine")
        each = " on" if self.replicas == 1 else ", each on"
        if not any(self.groups):
            where = " on the CPU"
        elif self.per_gpu > 1:
            where = f", {self.per_gpu} on each of {counted(self.replicas // self.per_gpu, 'GPU')}"
        elif self.tensor_parallel > 1:
            where = f"{each} {self.tensor_parallel} GPUs"
        else:
            where = " on 1 GPU" if self.replicas == 1 else ", one per GPU"
        if self.kept:
            return f"{engines}{where}, already running (started for an earlier job)"
        if not self.uncompiled:
            return f"{engines}{where}"
        starts = "starts" if self.replicas == 1 else "start"
        return f"{engines}{where}; {starts} without compiling"

    def describe(self) -> str:
        if not any(self.groups):
            engines = "one engine" if self.replicas == 1 else f"{self.replicas} engines"
            return f"{engines} on this machine ({self.reason})"
        engines = "engine" if self.replicas == 1 else "engines"
        if self.per_gpu > 1:
            gpus = self.replicas // self.per_gpu
            on = "1 GPU" if gpus == 1 else f"{gpus} GPUs"
            return f"{self.replicas} {engines}, {self.per_gpu} on each of {on} ({self.reason})"
        per = "GPU" if self.tensor_parallel == 1 else f"{self.tensor_parallel} GPUs"
        return f"{self.replicas} {engines}, {per} each ({self.reason})"


def choose_layout(config: EngineConfig, gpus: Sequence[Gpu], requests: int | None = None) -> Layout:
    """The layout for ``config`` on ``gpus`` (``config.gpus`` of them, if set) for a job of
    ``requests`` (None: unknown, as for the batches of a ``Dataset.map``: one engine per
    GPU unless ``config.engines_per_gpu`` says otherwise)."""
    return _uncompiled(_engines(config, gpus, requests), config, requests)


def in_process_layout(
    config: EngineConfig, gpus: Sequence[Gpu], requests: int | None = None
) -> Layout:
    """The layout of one engine in this process (a notebook's) for a job of
    ``requests`` (None: unknown): the first of ``gpus`` (none: the CPU), uncompiled as a
    command's engines are (``choose_layout``)."""
    device = ((gpus[0].name,),) if gpus else ((),)
    return _uncompiled(Layout(1, device, "one engine in this process"), config, requests)


def uncompiled_settings(layout: Layout) -> dict[str, Any]:
    """The engine settings of engines started without torch.compile: CUDA graphs for their
    decode steps where one engine has a GPU to itself; eager where engines share a GPU, and
    on the CPU, which has no graphs.

    torch.compile lengthens an engine's start (the most on a fresh host, with nothing
    compiled before) and made no step faster in any job measured, short or long. A lone
    engine's decode steps are bound by its one host thread launching kernels, which the
    graphs take over, for a few seconds of start spent capturing them; they are captured
    only up to the job's own size, the largest batch it can reach, so a small job captures
    only a few. Engines that share a GPU keep it busy without them, and start sooner eager.
    The measurements: ``docs/pages/performance.md#uncompiled-engines``.
    A model whose attention cannot be captured whole runs eager: vLLM then turns the graphs
    off with a warning (``CompilationConfig.resolve_cudagraph_mode_and_sizes``).
    """
    if layout.per_gpu > 1 or not any(layout.groups):
        return {"enforce_eager": True}
    largest = DECODE_GRAPHS_UP_TO
    if layout.requests_per_engine is not None:  # vLLM's capture sizes step by 8, then 16
        largest = min(largest, max(16, -(-layout.requests_per_engine // 16) * 16))
    graphs = {
        "mode": 0,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "max_cudagraph_capture_size": largest,
    }
    return {"compilation_config": graphs}


def _uncompiled(layout: Layout, config: EngineConfig, requests: int | None) -> Layout:
    """``layout``, its engines uncompiled (``uncompiled_settings``), unless the user decided
    compilation (``COMPILE_SETTINGS``); a job of ``requests`` (None: unknown)."""
    if any(key in config.engine_kwargs for key in COMPILE_SETTINGS):
        return layout
    per_engine = None if requests is None else -(-requests // layout.replicas)
    uncompiled = replace(layout, uncompiled=True, requests_per_engine=per_engine)
    how = "eager" if "enforce_eager" in uncompiled_settings(uncompiled) else "decode graphs"
    reason = f"{layout.reason}; {how}, uncompiled: starts sooner, runs as fast"
    return replace(uncompiled, reason=reason)


def _engines(config: EngineConfig, gpus: Sequence[Gpu], requests: int | None) -> Layout:
    """``choose_layout``'s engines and devices."""
    if config.gpus is not None:
        if config.gpus > len(gpus):
            raise ConfigError(f"--gpus {config.gpus}: only {len(gpus)} GPU(s) are visible")
        gpus = gpus[: config.gpus]
    per_gpu = config.engines_per_gpu
    if not gpus:
        engines = per_gpu or 1
        why = "no GPU is visible" + (f"; {engines} engines as asked" if engines > 1 else "")
        return Layout(1, ((),) * engines, why, per_gpu=engines)
    asked = config.engine_kwargs.get("tensor_parallel_size")
    if asked is not None:
        tp = int(asked) * int(config.engine_kwargs.get("pipeline_parallel_size", 1))
        if tp > len(gpus):
            raise ConfigError(f"tensor_parallel_size {asked} needs more than {len(gpus)} GPUs")
        if tp > 1 and (per_gpu or 1) > 1:
            raise ConfigError(
                f"engines_per_gpu {per_gpu} needs a model that runs on one GPU, "
                f"not tensor_parallel_size {asked}"
            )
        layout = _groups(gpus, tp, f"tensor_parallel_size {asked} as asked")
        return _shared(layout, config, gpus, per_gpu, requests) if tp == 1 and per_gpu else layout
    weights = model_bytes(config)
    smallest = min(gpu.memory for gpu in gpus)
    if weights is None:
        layout = _groups(gpus, 1, "the model's size is unknown: one engine per GPU")
        return _shared(layout, config, gpus, per_gpu, requests)
    tp = 1
    while weights / tp > WEIGHTS_SHARE * smallest and tp < len(gpus):
        tp *= 2
    if weights / tp > WEIGHTS_SHARE * smallest:
        tp = len(gpus)  # the most there is; vLLM will say if even that is too little
    size = f"{weights / GIB:.1f} GiB of weights"
    if tp == 1:
        reason = f"{size} fit one GPU of {smallest / GIB:.0f} GiB with room to spare"
        return _shared(_groups(gpus, 1, reason), config, gpus, per_gpu, requests)
    if (per_gpu or 1) > 1:
        raise ConfigError(f"engines_per_gpu {per_gpu}: {size} do not fit one GPU")
    reason = f"{size} need {tp} GPUs of {smallest / GIB:.0f} GiB, encoder data-parallel"
    return _groups(gpus, tp, reason)


def _shared(
    layout: Layout,
    config: EngineConfig,
    gpus: Sequence[Gpu],
    asked: int | None,
    requests: int | None,
) -> Layout:
    """``layout`` (one engine per GPU) with ``asked`` engines on each GPU (None: the
    default, as many as fit up to ``DEFAULT_ENGINES_PER_GPU`` for a job of more than
    ``ONE_ENGINE_REQUESTS``), each with a KV cache of what its share of the GPU leaves
    beside its weights and ``ACTIVATION_RESERVE``."""
    weights = model_bytes(config)
    large = requests is not None and requests > ONE_ENGINE_REQUESTS
    per_gpu = asked or (DEFAULT_ENGINES_PER_GPU if large else 1)
    if per_gpu > 1 and weights is None:
        if asked is None:
            return layout
        raise ConfigError(
            f"engines_per_gpu {per_gpu}: the model's size is unknown (not a local folder), "
            "so its share of each GPU cannot be sized"
        )
    if per_gpu == 1 or weights is None:
        return layout
    share = float(config.engine_kwargs.get("gpu_memory_utilization", VLLM_MEMORY_SHARE))
    smallest = min(gpu.memory for gpu in gpus)

    def kv_bytes(engines: int) -> int:
        return int(share * smallest / engines - weights - max(ACTIVATION_RESERVE, weights // 2))

    while asked is None and per_gpu > 1 and kv_bytes(per_gpu) < weights:
        per_gpu -= 1  # the default takes only engines whose KV cache outgrows their weights
    if per_gpu == 1:
        return layout
    kv = kv_bytes(per_gpu)
    if kv <= 0:
        raise ConfigError(
            f"engines_per_gpu {per_gpu}: {weights / GIB:.1f} GiB of weights {per_gpu} times "
            f"leave no KV cache in {share:.0%} of {smallest / GIB:.0f} GiB"
        )
    why = "as asked" if asked else f"the default for over {ONE_ENGINE_REQUESTS} requests"
    reason = f"{layout.reason}; {per_gpu} engines per GPU ({why}), {kv / GIB:.1f} GiB KV each"
    groups = tuple(group for _ in range(per_gpu) for group in layout.groups)
    return Layout(1, groups, reason, per_gpu=per_gpu, kv_cache_bytes=kv)


def _groups(gpus: Sequence[Gpu], tp: int, reason: str) -> Layout:
    names = [gpu.name for gpu in gpus]
    groups = tuple(tuple(names[i : i + tp]) for i in range(0, len(names) - tp + 1, tp))
    return Layout(tp, groups, reason)


def visible_gpus() -> list[Gpu]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES`` respected), from NVML, which
    starts no CUDA context; none where NVML is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        found = {
            str(i): Gpu(
                str(i),
                int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
            )
            for i, handle in enumerate(handles)
        }
    except Exception:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [n.strip() for n in visible.split(",") if n.strip()] if visible is not None else None
    chosen = names if names is not None else sorted(found, key=int)
    return [found[name] for name in chosen if name in found]


def model_bytes(config: EngineConfig) -> int | None:
    """The model's weights in bytes: its safetensors files' sizes, else an estimate from
    its config (a config-only directory), else None (a hub name not on disk)."""
    root = Path(config.model)
    if not root.is_dir():
        return None
    files = list(root.glob("*.safetensors"))
    if files:
        return sum(f.stat().st_size for f in files)
    path = root / "config.json"
    if not path.is_file():
        return None
    settings = json.loads(path.read_text())
    dtype = str(config.engine_kwargs.get("dtype") or _dtype(settings))
    width = 4 if dtype in ("float32", "float") else 1 if "8" in dtype else 2
    return width * parameters(settings)


def parameters(settings: Mapping[str, Any]) -> int:
    """An estimate of a transformer's parameters from its config: the language model's
    layers and embeddings, and a vision tower's blocks (close enough to choose GPUs by)."""
    text = settings.get("text_config") or settings
    h = int(text.get("hidden_size", 0))
    layers = int(text.get("num_hidden_layers", 0))
    inner = int(text.get("intermediate_size", 4 * h))
    heads = int(text.get("num_attention_heads", 1)) or 1
    kv = int(text.get("num_key_value_heads", heads))
    head_dim = int(text.get("head_dim", h // heads))
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    vocab = int(text.get("vocab_size", settings.get("vocab_size", 0)))
    tied = bool(settings.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    total = layers * (attention + 3 * h * inner) + vocab * h * (1 if tied else 2)
    vision = settings.get("vision_config") or {}
    d = int(vision.get("hidden_size") or vision.get("embed_dim") or 0)
    depth = int(vision.get("depth") or vision.get("num_hidden_layers") or 0)
    v_inner = int(vision.get("intermediate_size") or d * int(vision.get("mlp_ratio", 4)))
    return total + depth * (4 * d * d + 3 * d * v_inner)


def _dtype(settings: Mapping[str, Any]) -> str:
    text = settings.get("text_config") or {}
    return str(settings.get("torch_dtype") or settings.get("dtype") or text.get("dtype") or "")
