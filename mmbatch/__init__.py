"""mmbatch: multimodal batch captioning and extraction on vLLM's offline engine.

The public API is exactly ``__all__``. Names whose modules import Pillow, tqdm or vLLM are
loaded on first use, so ``import mmbatch`` (and ``mmbatch --help``) stays instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mmbatch import clock as _clock  # noqa: F401 (marks the interpreter's start)
from mmbatch.engine.base import Engine
from mmbatch.engine.config import EngineConfig
from mmbatch.errors import (
    ConfigError,
    FatalEngineError,
    ItemFailure,
    MediaError,
    MmbatchError,
    RequestRejected,
    SourceError,
)
from mmbatch.media.options import AudioOptions, ImageOptions, MediaOptions, VideoOptions
from mmbatch.types import (
    CacheStats,
    ItemError,
    MediaItem,
    MediaRef,
    Request,
    Result,
    Sampling,
    Usage,
)

if TYPE_CHECKING:
    from mmbatch.engine.kept import connect_engine
    from mmbatch.engine.vllm import VLLMEngine
    from mmbatch.integrations.dataset_runs import run_dataset
    from mmbatch.integrations.hf_datasets import DatasetMap
    from mmbatch.jobs import Job, run_in_memory, run_job
    from mmbatch.notebook import caption, load_engine
    from mmbatch.output.file_output import FileOutput
    from mmbatch.output.summary import JobReport
    from mmbatch.pipeline import RunConfig
    from mmbatch.sources.clips import ClipSplit, clip_requests
    from mmbatch.sources.files import image_requests
    from mmbatch.sources.timeline import audio_requests, frame_requests

__version__ = "0.1.0"

_LAZY = {
    "DatasetMap": "mmbatch.integrations.hf_datasets",
    "VLLMEngine": "mmbatch.engine.vllm",
    "FileOutput": "mmbatch.output.file_output",
    "Job": "mmbatch.jobs",
    "JobReport": "mmbatch.output.summary",
    "run_job": "mmbatch.jobs",
    "run_dataset": "mmbatch.integrations.dataset_runs",
    "run_in_memory": "mmbatch.jobs",
    "caption": "mmbatch.notebook",
    "load_engine": "mmbatch.notebook",
    "connect_engine": "mmbatch.engine.kept",
    "RunConfig": "mmbatch.pipeline",
    "image_requests": "mmbatch.sources.files",
    "ClipSplit": "mmbatch.sources.clips",
    "clip_requests": "mmbatch.sources.clips",
    "frame_requests": "mmbatch.sources.timeline",
    "audio_requests": "mmbatch.sources.timeline",
}

__all__ = [
    "AudioOptions",
    "CacheStats",
    "ClipSplit",
    "ConfigError",
    "DatasetMap",
    "Engine",
    "EngineConfig",
    "FatalEngineError",
    "FileOutput",
    "ImageOptions",
    "ItemError",
    "ItemFailure",
    "Job",
    "JobReport",
    "MediaError",
    "MediaItem",
    "MediaOptions",
    "MediaRef",
    "MmbatchError",
    "Request",
    "RequestRejected",
    "Result",
    "RunConfig",
    "Sampling",
    "SourceError",
    "Usage",
    "VLLMEngine",
    "VideoOptions",
    "__version__",
    "audio_requests",
    "caption",
    "clip_requests",
    "connect_engine",
    "frame_requests",
    "image_requests",
    "load_engine",
    "run_dataset",
    "run_in_memory",
    "run_job",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mmbatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
