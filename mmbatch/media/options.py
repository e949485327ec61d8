"""How media are decoded: one options object per modality, validated where it is made.

Every field that changes a decoded payload is part of the media key (``cache_token``), so two
decodings of one file with different options never share a key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from mmbatch.errors import ConfigError
from mmbatch.media.fetch import UrlPolicy

DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
"""Images larger than this (width x height, before decoding) are refused as likely bombs."""
DEFAULT_MAX_VIDEO_PIXELS = DEFAULT_MAX_IMAGE_PIXELS
"""Videos whose frames are larger than this (width x height, read from the stream's header
before any frame is decoded) are refused: a 1.6 MB 16000x16000 ``.mov`` would otherwise take
gigabytes to decode."""


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
"""The cap on the frames one clip takes whatever the sampling asks: an hour at 2 fps would
otherwise become a clip of 7200 frames, which no model's context holds (vLLM issue #15136).
Frame jobs have no default cap: each frame is its own request, and each is taken."""


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
    max_frames: int | None = None
    """The most frames taken from one video (spread evenly when the sampling asks for more);
    None: every frame a frame job asks for, and ``DEFAULT_MAX_FRAMES`` for a clip."""
    max_pixels: int | None = None
    """Downscale (keeping aspect) each frame to at most this many pixels; None keeps size."""
    min_frames: int | None = None
    """The fewest frames the budget may shrink a clip to; None: never fewer than sampled."""
    min_pixels: int | None = None
    """The fewest pixels per frame the budget may shrink a clip to; None: no shrinking."""
    max_source_pixels: int = DEFAULT_MAX_VIDEO_PIXELS
    """Refuse, before decoding, any video whose header claims frames larger than this."""

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
        if self.max_frames is not None and self.max_frames < 1:
            raise ConfigError(f"max_frames must be >= 1, got {self.max_frames}")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ConfigError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if self.min_frames is not None and self.min_frames < 1:
            raise ConfigError(f"min_frames must be >= 1, got {self.min_frames}")
        if self.min_pixels is not None and self.min_pixels < 1:
            raise ConfigError(f"min_pixels must be >= 1, got {self.min_pixels}")
        if self.max_source_pixels < 1:
            raise ConfigError(f"max_source_pixels must be >= 1, got {self.max_source_pixels}")

    @property
    def clip_max_frames(self) -> int:
        """The most frames one clip takes: ``max_frames``, else ``DEFAULT_MAX_FRAMES``."""
        return self.max_frames if self.max_frames is not None else DEFAULT_MAX_FRAMES

    def sampling_token(self) -> dict[str, Any]:
        """The fields that decide which frames a clip takes (only the active way of sampling)."""
        token: dict[str, Any] = {"sampling": self.sampling, "max_frames": self.clip_max_frames}
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

    sample_rate: int | None = None
    """Resample to this; None: the model's own rate (``DEFAULT_SAMPLE_RATE`` where the model
    does not say), settled by ``at_model_rate`` before any key is made."""
    window_s: float = DEFAULT_AUDIO_WINDOW_S
    overlap_s: float = 0.0

    def __post_init__(self) -> None:
        if self.sample_rate is not None and self.sample_rate < 1:
            raise ConfigError(f"sample_rate must be >= 1, got {self.sample_rate}")
        if not self.window_s > 0:
            raise ConfigError(f"window_s must be > 0, got {self.window_s}")
        if not 0 <= self.overlap_s < self.window_s:
            raise ConfigError(
                f"overlap_s must be >= 0 and below window_s={self.window_s}, got {self.overlap_s}"
            )

    @property
    def rate(self) -> int:
        """The rate audio is decoded at (``sample_rate``, else the default)."""
        return self.sample_rate or DEFAULT_SAMPLE_RATE

    def at_model_rate(self, model_rate: int | None) -> AudioOptions:
        """These options with the rate settled: the user's, else the model's, else the default."""
        return replace(self, sample_rate=self.sample_rate or model_rate or DEFAULT_SAMPLE_RATE)

    def cache_token(self) -> str:
        """A canonical string of the decode options; each window's span is keyed on top."""
        return json.dumps({"sample_rate": self.rate}, sort_keys=True)


@dataclass(frozen=True)
class MediaOptions:
    """Everything the loader needs to know about a job's media: how each modality is decoded,
    whether URLs may be fetched (and within which limits), and where sampled frames are saved."""

    image: ImageOptions = field(default_factory=ImageOptions)
    video: VideoOptions = field(default_factory=VideoOptions)
    audio: AudioOptions = field(default_factory=AudioOptions)
    urls: UrlPolicy | None = None
    """Fetch http(s) sources within these limits; None refuses URLs (error rows)."""
    frame_dir: str | None = None
    """Where decoded video frames are also written as JPEG (``--save-frames``); None: nowhere."""
    frame_pixels: int | None = None
    """The most pixels of a video frame captioned as a picture (``mmbatch frames``); None:
    the video options' ``max_pixels``. Set when the model's limits are settled."""

    @property
    def frame_max_pixels(self) -> int | None:
        return self.frame_pixels or self.video.max_pixels


def scaled_size(width: int, height: int, max_pixels: int | None) -> tuple[int, int]:
    """``(width, height)`` scaled down, keeping aspect, to at most ``max_pixels`` pixels (the
    size a picture or a frame is decoded to under a ``max_pixels`` option)."""
    if max_pixels is None or width * height <= max_pixels:
        return width, height
    scale = (max_pixels / (width * height)) ** 0.5
    return max(1, int(width * scale)), max(1, int(height * scale))
