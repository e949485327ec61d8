"""Decoded ``MediaItem``s for each kind of reference, and the key tokens that name them.

Each key token lists exactly what changes the decoded payload besides the source bytes:

* a clip: the sampling (how frames are picked, the cap) and the frame size;
* a frame of a video: which frame (index and time) and the frame size, *not* the sampling
  that picked it, so the same frame picked by ``--fps 1`` and by ``--keyframes`` is one item;
* an audio window: the sample rate and the window's span.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmbatch.errors import MediaError
from mmbatch.media.options import AudioOptions, ImageOptions, VideoOptions
from mmbatch.media.video import VideoIndex
from mmbatch.types import FrameAt, MediaItem, TimeSpan


def image_item(key: str, data: bytes | memoryview, options: ImageOptions) -> MediaItem:
    """An image file's bytes decoded with Pillow."""
    from mmbatch.media.image import decode_image

    return _image_item(key, decode_image(data, options))


def _image_item(key: str, image: Any) -> MediaItem:
    width, height = image.size
    meta = {"width": width, "height": height, "nbytes": width * height * 3}
    return MediaItem("image", key, image, meta)


def decoded_image_item(key: str, image: Any, options: ImageOptions) -> MediaItem:
    """A picture some library already decoded, made what ``image_item`` would give."""
    from mmbatch.media.image import prepare_decoded

    return _image_item(key, prepare_decoded(image, options))


def frame_token(frame: FrameAt, options: VideoOptions) -> str:
    return json.dumps(
        {"frame": frame.index, "pts": round(frame.pts, 6), "max_pixels": options.max_pixels},
        sort_keys=True,
    )


class FrameBatch:
    """The frames of one video that a window wants, decoded together in one pass on first use.

    The store asks for frames one key at a time; the first miss decodes every wanted frame
    of the video (seeking between them), so a video is opened and decoded once per window,
    not once per frame.
    """

    def __init__(
        self,
        source: str,
        index: Callable[[], VideoIndex],
        max_pixels: int | None,
        save_dir: Path | None = None,
    ) -> None:
        self.source = source
        self._index = index
        self.max_pixels = max_pixels
        self.save_dir = save_dir
        self._wanted: dict[str, FrameAt] = {}
        self._decoded: dict[str, MediaItem] | None = None

    def want(self, key: str, frame: FrameAt) -> None:
        self._wanted[key] = frame

    def item(self, key: str) -> MediaItem:
        if self._decoded is None:
            self._decoded = self._decode_all()
        item = self._decoded.get(key)
        if item is None:
            frame = self._wanted[key]
            raise MediaError(
                f"frame {frame.index} at {frame.pts:.3f} s could not be decoded "
                "(truncated or damaged video)"
            )
        return item

    def _decode_all(self) -> dict[str, MediaItem]:
        from PIL import Image

        from mmbatch.media.video import decode_frames

        index = self._index()
        for frame in self._wanted.values():
            if frame.index >= len(index.pts):
                raise MediaError(f"the video has no frame {frame.index}")
        arrays = decode_frames(
            self.source, index, (f.index for f in self._wanted.values()), self.max_pixels
        ).frames
        items = {}
        for key, frame in self._wanted.items():
            rgb = arrays.get(frame.index)
            if rgb is not None:
                height, width = rgb.shape[:2]
                meta = {"width": width, "height": height, "nbytes": rgb.nbytes}
                image = Image.fromarray(rgb)
                items[key] = MediaItem("image", key, image, meta)
                if self.save_dir is not None:
                    image.save(self.save_dir / frame_file_name(self.source, frame.pts), quality=90)
        return items


def frame_file_name(video: str, pts: float) -> str:
    """``clips_a.mp4@12.500.jpg`` for the frame of ``clips/a.mp4`` at 12.5 s: the video's
    path, flattened so that videos of one name in two folders do not collide, then the time."""
    flat = Path(video).as_posix().lstrip("./").replace("/", "_") or "video"
    return f"{flat}@{pts:.3f}.jpg"


def clip_item(key: str, source: str, index: VideoIndex, options: VideoOptions) -> MediaItem:
    """The frames ``options`` samples from ``source``, as one video item."""
    from mmbatch.media.video import clip_from, select_frames

    frames, metadata = clip_from(source, index, select_frames(index, options), options.max_pixels)
    count, height, width = frames.shape[:3]
    meta = {"frames": count, "width": width, "height": height, "nbytes": frames.nbytes}
    return MediaItem("video", key, (frames, metadata), meta)


def audio_token(span: TimeSpan | None, options: AudioOptions) -> str:
    window = None if span is None else [round(span.start, 6), round(span.end, 6)]
    return json.dumps({"sample_rate": options.rate, "span": window}, sort_keys=True)


def audio_item(key: str, source: str, span: TimeSpan | None, options: AudioOptions) -> MediaItem:
    """``source`` (or its ``span``) as mono float32 at the model's rate, vLLM's audio form."""
    from mmbatch.media.audio import decode_audio

    samples = decode_audio(source, options.rate, span)
    if samples.size == 0:
        raise MediaError("the audio window holds no samples")
    meta: dict[str, Any] = {
        "samples": int(samples.size),
        "seconds": samples.size / options.rate,
        "nbytes": samples.nbytes,
    }
    return MediaItem("audio", key, (samples, options.rate), meta)
