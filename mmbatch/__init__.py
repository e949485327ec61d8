"""mmbatch: multimodal batch captioning and extraction on vLLM's offline engine.

The public API is exactly ``__all__``. Names whose modules import Pillow, tqdm or vLLM are
loaded on first use, so ``import mmbatch`` (and ``mmbatch --help``) stays instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mmbatch.config import AudioOptions, EngineConfig, ImageOptions, RunConfig, VideoOptions
from mmbatch.engine.base import CacheStats, Engine
from mmbatch.errors import (
    ConfigError,
    FatalEngineError,
    ItemFailure,
    MediaError,
    MmbatchError,
    RequestRejected,
    SourceError,
)
from mmbatch.types import ItemError, MediaItem, MediaRef, Request, Result, Sampling, Usage

if TYPE_CHECKING:
    from mmbatch.engine.vllm import VLLMEngine
    from mmbatch.integrations.hf_datasets import DatasetMap
    from mmbatch.media.loader import MediaLoader
    from mmbatch.media.store import MediaStore
    from mmbatch.media_sources import audio_requests, frame_requests
    from mmbatch.pipeline import run_job
    from mmbatch.sinks import JsonlSink
    from mmbatch.sources import image_requests

__version__ = "0.1.0"

_LAZY = {
    "DatasetMap": "mmbatch.integrations.hf_datasets",
    "VLLMEngine": "mmbatch.engine.vllm",
    "MediaLoader": "mmbatch.media.loader",
    "MediaStore": "mmbatch.media.store",
    "run_job": "mmbatch.pipeline",
    "JsonlSink": "mmbatch.sinks",
    "image_requests": "mmbatch.sources",
    "frame_requests": "mmbatch.media_sources",
    "audio_requests": "mmbatch.media_sources",
}

__all__ = [
    "AudioOptions",
    "CacheStats",
    "ConfigError",
    "DatasetMap",
    "Engine",
    "EngineConfig",
    "FatalEngineError",
    "ImageOptions",
    "ItemError",
    "ItemFailure",
    "JsonlSink",
    "MediaError",
    "MediaItem",
    "MediaLoader",
    "MediaRef",
    "MediaStore",
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
    "frame_requests",
    "image_requests",
    "run_job",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mmbatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
