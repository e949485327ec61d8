"""Settings, grouped by the stage that reads them, validated where they are made.

``EngineConfig.engine_kwargs`` is handed to ``vllm.LLM`` untouched: mmbatch does not
re-declare vLLM's options, it only fills in a few defaults the job needs (metrics on,
encoder data-parallel mode under tensor parallelism) that the user can still override.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mmbatch.errors import ConfigError

DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
"""Images larger than this (width x height, before decoding) are refused as likely bombs."""

DEFAULT_WINDOW = 512
"""Requests prepared (read, hashed, decoded, planned) together; large enough that repeated
media and shared prefixes land together, small enough to bound decoded pixels in memory."""


@dataclass(frozen=True)
class ImageOptions:
    """How an image is decoded. Every field is part of the media key."""

    max_pixels: int | None = None
    """Downscale (keeping aspect) to at most this many pixels after decoding; None keeps size."""
    max_source_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    """Refuse, before decoding, any image whose header claims more pixels than this."""

    def __post_init__(self) -> None:
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ConfigError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if self.max_source_pixels < 1:
            raise ConfigError(f"max_source_pixels must be >= 1, got {self.max_source_pixels}")

    def cache_token(self) -> str:
        """A canonical string of the options, hashed into every media key."""
        return json.dumps({"max_pixels": self.max_pixels}, sort_keys=True)


VideoSampling = Literal["fps", "num_frames", "keyframes", "timestamps"]
"""How frames are picked from a video: at a rate, a fixed number spread evenly, every key
frame, or at explicit times."""

DEFAULT_NUM_FRAMES = 8
DEFAULT_MAX_FRAMES = 64
"""A cap on the frames taken from one video whatever the sampling asks: an hour at 2 fps would
otherwise become 7200 frames, which no model's context holds (vLLM issue #15136)."""


@dataclass(frozen=True)
class VideoOptions:
    """How frames are sampled from a video and decoded. Every field that changes the decoded
    frames is part of the media key.

    Exactly one way of sampling applies, named by ``sampling``; the others' values are ignored
    (and left out of the key). ``min_frames`` and ``min_pixels`` are how far the pre-flight
    budget may shrink a clip that does not fit the model; by default it may not shrink it.
    """

    sampling: VideoSampling = "num_frames"
    num_frames: int = DEFAULT_NUM_FRAMES
    fps: float = 1.0
    timestamps: tuple[float, ...] = ()
    max_frames: int = DEFAULT_MAX_FRAMES
    max_pixels: int | None = None
    """Downscale (keeping aspect) each frame to at most this many pixels; None keeps size."""
    min_frames: int | None = None
    """The fewest frames the budget may shrink a clip to; None: never fewer than sampled."""
    min_pixels: int | None = None
    """The fewest pixels per frame the budget may shrink a clip to; None: no shrinking."""

    def __post_init__(self) -> None:
        if self.sampling not in ("fps", "num_frames", "keyframes", "timestamps"):
            raise ConfigError(f"unknown video sampling {self.sampling!r}")
        if self.num_frames < 1:
            raise ConfigError(f"num_frames must be >= 1, got {self.num_frames}")
        if not self.fps > 0:
            raise ConfigError(f"fps must be > 0, got {self.fps}")
        if self.sampling == "timestamps" and not self.timestamps:
            raise ConfigError("timestamps sampling needs at least one timestamp")
        if any(t < 0 for t in self.timestamps):
            raise ConfigError(f"timestamps must be >= 0, got {list(self.timestamps)}")
        if self.max_frames < 1:
            raise ConfigError(f"max_frames must be >= 1, got {self.max_frames}")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ConfigError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if self.min_frames is not None and self.min_frames < 1:
            raise ConfigError(f"min_frames must be >= 1, got {self.min_frames}")
        if self.min_pixels is not None and self.min_pixels < 1:
            raise ConfigError(f"min_pixels must be >= 1, got {self.min_pixels}")

    def sampling_token(self) -> dict[str, Any]:
        """The fields that decide which frames are taken (only the active way of sampling)."""
        token: dict[str, Any] = {"sampling": self.sampling, "max_frames": self.max_frames}
        if self.sampling == "num_frames":
            token["num_frames"] = self.num_frames
        elif self.sampling == "fps":
            token["fps"] = self.fps
        elif self.sampling == "timestamps":
            token["timestamps"] = list(self.timestamps)
        return token

    def cache_token(self) -> str:
        """A canonical string of the options, hashed into every clip's media key."""
        return json.dumps({**self.sampling_token(), "max_pixels": self.max_pixels}, sort_keys=True)


DEFAULT_SAMPLE_RATE = 16_000
"""Qwen2-Audio's (and Whisper's) rate. vLLM resamples with torchaudio, which cannot load beside
the CPU torch, so audio must reach it at the model's rate already."""
DEFAULT_AUDIO_WINDOW_S = 30.0
"""Qwen2-Audio's feature extractor keeps 30 s; longer audio is cut into windows of this."""


@dataclass(frozen=True)
class AudioOptions:
    """How audio is decoded (mono, resampled) and cut into windows. All of it is in the key."""

    sample_rate: int = DEFAULT_SAMPLE_RATE
    window_s: float = DEFAULT_AUDIO_WINDOW_S
    overlap_s: float = 0.0

    def __post_init__(self) -> None:
        if self.sample_rate < 1:
            raise ConfigError(f"sample_rate must be >= 1, got {self.sample_rate}")
        if not self.window_s > 0:
            raise ConfigError(f"window_s must be > 0, got {self.window_s}")
        if not 0 <= self.overlap_s < self.window_s:
            raise ConfigError(
                f"overlap_s must be >= 0 and below window_s={self.window_s}, got {self.overlap_s}"
            )

    def cache_token(self) -> str:
        """A canonical string of the decode options; each window's span is keyed on top."""
        return json.dumps({"sample_rate": self.sample_rate}, sort_keys=True)


@dataclass(frozen=True)
class EngineConfig:
    """Which model to run and the keyword arguments for ``vllm.LLM``."""

    model: str
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("a model is required (a local directory or a hub name)")
        if "model" in self.engine_kwargs:
            raise ConfigError("pass the model as EngineConfig.model, not as an engine argument")

    def llm_kwargs(self) -> dict[str, Any]:
        """Arguments for ``vllm.LLM``: the user's, over the few defaults mmbatch relies on."""
        kwargs: dict[str, Any] = {
            # The summary's cache hit rates come from llm.get_metrics(), which needs stats on.
            "disable_log_stats": False,
            "enable_prefix_caching": True,
            # Bigger scheduler steps: more image prefills per step (measured on an H200,
            # mmbatch/bench/results/); the user's value wins.
            "max_num_batched_tokens": 32768,
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


@dataclass(frozen=True)
class RunConfig:
    """How the pipeline drives the engine."""

    window: int = DEFAULT_WINDOW
    progress: bool = True

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ConfigError(f"window must be >= 1, got {self.window}")


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
