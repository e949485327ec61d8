"""Decoding, as jobs a worker process can run: each job names what to decode and returns
every item it makes, or the error that stopped it, by media key.

Decoding and resizing hold the GIL in the parts that matter, so threads do not scale past
one core; these jobs are plain picklable values and ``decode`` a top-level function, so a
pool of worker processes runs them. What comes back is a ``MediaItem`` (pixels as a PIL
image or an array, the audio as an array) or an ``ItemError``: errors travel as data, since
an exception's own fields do not survive pickling.

Each key token lists exactly what changes the decoded payload besides the source bytes:

* an image: the decode options (``ImageOptions.cache_token``);
* a frame of a video: which frame (index and time) and the frame size, *not* the sampling
  that picked it, so the same frame picked by ``--fps 1`` and by ``--keyframes`` is one item;
* a clip: the sampling (how frames are picked, the cap) and the frame size, and for a clip
  cut from a video (``ClipSpan``) which of its frames it spans;
* an audio window: the sample rate and the window's span.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from mmbatch.errors import MediaError
from mmbatch.media.fetch import UrlPolicy
from mmbatch.media.options import AudioOptions, ImageOptions, VideoOptions
from mmbatch.media.video import VideoIndex
from mmbatch.types import ClipSpan, FileId, FrameAt, ItemError, MediaItem, TimeSpan

Decoded: TypeAlias = "dict[str, MediaItem | ItemError]"
"""What a job made: an item, or the reason it could not be made, by media key."""


class _OneItem:
    """A job that makes one media item, under its ``key``."""

    key: str

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,)


_Job = TypeVar("_Job", bound="_ReadsItsFile")


class _ReadsItsFile:
    """A job that reads its source file itself: it holds no media bytes, and a pipe to a
    worker process carries it as it is."""

    @property
    def held_bytes(self) -> int:
        return 0

    def portable(self: _Job) -> _Job:
        return self


@dataclass(frozen=True)
class ImageJob(_OneItem):
    """An image's bytes (a file's, or a dataset cell's), to decode with Pillow."""

    key: str
    data: bytes | memoryview
    options: ImageOptions

    @property
    def held_bytes(self) -> int:
        return len(self.data)

    def portable(self) -> ImageJob:
        """This job with bytes a pipe can carry (a memoryview into a mapped file cannot)."""
        return self if isinstance(self.data, bytes) else replace(self, data=bytes(self.data))


@dataclass(frozen=True)
class ImageFileJob(_OneItem, _ReadsItsFile):
    """A picture file (or URL) keyed earlier in the job (``Keyer``: a file is hashed, a URL
    fetched, once per job), read again only if its item must be decoded again (the store let
    it go). Its bytes must still be those of ``key``: a file changed since is that item's
    error, never another picture under the key."""

    key: str
    source: str
    options: ImageOptions
    pinned: FileId | None = None
    urls: UrlPolicy | None = None
    """The job's bounds on a fetch, for a picture fetched from an http(s) URL."""


@dataclass(frozen=True)
class DecodedImageJob(_OneItem):
    """A picture some library already decoded (a datasets ``Image()`` cell), made what an
    ``ImageJob`` would give: capped, RGB, resized."""

    key: str
    image: Any
    options: ImageOptions

    @property
    def held_bytes(self) -> int:
        width, height = self.image.size
        return int(width * height * len(self.image.getbands()))

    def portable(self) -> DecodedImageJob:
        return self


@dataclass(frozen=True)
class FramesJob(_ReadsItsFile):
    """Frames of one video, decoded together in one pass (seeking between them)."""

    source: str
    index: VideoIndex
    frames: tuple[tuple[str, FrameAt], ...]
    """``(key, frame)`` for each wanted frame."""
    max_pixels: int | None
    save_dir: str | None = None
    """Also write each frame here as JPEG (``--save-frames``)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.frames)


@dataclass(frozen=True)
class ClipJob(_OneItem, _ReadsItsFile):
    """The frames ``options`` samples from a video, or from the stretch of it ``span``
    names, as one clip."""

    key: str
    source: str
    index: VideoIndex
    options: VideoOptions
    span: ClipSpan | None = None


@dataclass(frozen=True)
class AudioJob(_OneItem, _ReadsItsFile):
    """An audio file (or one window of it), mono, at the options' rate."""

    key: str
    source: str
    span: TimeSpan | None
    options: AudioOptions
    pinned: FileId | None = None
    """The file the path rule checked (``MediaRef.pinned``)."""


DecodeJob: TypeAlias = "ImageJob | ImageFileJob | DecodedImageJob | FramesJob | ClipJob | AudioJob"


def decode(job: DecodeJob) -> Decoded:
    """Run ``job``; whatever a decoder raises on hostile bytes is that item's error, never
    the job's (a worker process must survive every input)."""
    try:
        return _DECODERS[type(job)](job)
    except MediaError as exc:
        error = ItemError(exc.stage, str(exc), exc.kind)
    except Exception as exc:
        error = ItemError("decode", f"the decoder failed: {type(exc).__name__}: {exc}", "corrupt")
    return dict.fromkeys(job.keys, error)


def _image(job: ImageJob) -> Decoded:
    from mmbatch.media.image import decode_image

    return {job.key: _image_item(job.key, decode_image(job.data, job.options))}


def _image_file(job: ImageFileJob) -> Decoded:
    from mmbatch.media.fetch import read_source
    from mmbatch.media.hashing import media_key
    from mmbatch.media.image import decode_image

    data = read_source(job.source, job.urls, pinned=job.pinned)
    if media_key("image", data, job.options.cache_token()) != job.key:
        raise MediaError(
            f"{job.source!r} changed while the job ran; run the job again to caption it",
            stage="load",
            kind="unreadable",
        )
    return {job.key: _image_item(job.key, decode_image(data, job.options))}


def _decoded_image(job: DecodedImageJob) -> Decoded:
    from mmbatch.media.image import prepare_decoded

    return {job.key: _image_item(job.key, prepare_decoded(job.image, job.options))}


def _image_item(key: str, image: Any) -> MediaItem:
    width, height = image.size
    meta = {"width": width, "height": height, "nbytes": width * height * 3}
    return MediaItem("image", key, image, meta)


def _frames(job: FramesJob) -> Decoded:
    from PIL import Image

    from mmbatch.media.video import decode_frames

    index = job.index
    if job.save_dir is not None:
        Path(job.save_dir).mkdir(parents=True, exist_ok=True)
    wanted = [frame.index for _, frame in job.frames if frame.index < len(index.pts)]
    arrays = decode_frames(job.source, index, wanted, job.max_pixels).frames
    out: Decoded = {}
    for key, frame in job.frames:
        rgb = arrays.get(frame.index)
        if frame.index >= len(index.pts):
            out[key] = ItemError("decode", f"the video has no frame {frame.index}", "corrupt")
        elif rgb is None:
            out[key] = ItemError(
                "decode",
                f"frame {frame.index} at {frame.pts:.3f} s could not be decoded "
                "(truncated or damaged video)",
                "corrupt",
            )
        else:
            height, width = rgb.shape[:2]
            image = Image.fromarray(rgb)
            out[key] = MediaItem(
                "image", key, image, {"width": width, "height": height, "nbytes": rgb.nbytes}
            )
            if job.save_dir is not None:
                image.save(Path(job.save_dir) / frame_file_name(job.source, frame.pts), quality=90)
    return out


def frame_file_name(video: str, pts: float) -> str:
    """``clips_a.mp4@12.500.jpg`` for the frame of ``clips/a.mp4`` at 12.5 s: the video's
    path, flattened so that videos of one name in two folders do not collide, then the time."""
    flat = Path(video).as_posix().lstrip("./").replace("/", "_") or "video"
    return f"{flat}@{pts:.3f}.jpg"


def _clip(job: ClipJob) -> Decoded:
    from mmbatch.media.video import clip_from, select_frames

    index, options, span = job.index, job.options, job.span
    clip = index if span is None else index.between(span.first, span.stop)
    frames, metadata = clip_from(
        job.source, clip, select_frames(clip, options), options.max_pixels, whole=index
    )
    count, height, width = frames.shape[:3]
    meta = {"frames": count, "width": width, "height": height, "nbytes": frames.nbytes}
    return {job.key: MediaItem("video", job.key, (frames, metadata), meta)}


def _audio(job: AudioJob) -> Decoded:
    from mmbatch.media.audio import decode_audio

    rate = job.options.rate
    samples = decode_audio(job.source, rate, job.span, job.pinned)
    if samples.size == 0:
        raise MediaError("the audio window holds no samples")
    meta: dict[str, Any] = {
        "samples": int(samples.size),
        "seconds": samples.size / rate,
        "nbytes": samples.nbytes,
    }
    return {job.key: MediaItem("audio", job.key, (samples, rate), meta)}


_DECODERS: dict[type, Callable[[Any], Decoded]] = {
    ImageJob: _image,
    ImageFileJob: _image_file,
    DecodedImageJob: _decoded_image,
    FramesJob: _frames,
    ClipJob: _clip,
    AudioJob: _audio,
}


def frame_token(frame: FrameAt, max_pixels: int | None) -> str:
    return json.dumps(
        {"frame": frame.index, "pts": round(frame.pts, 6), "max_pixels": max_pixels},
        sort_keys=True,
    )


def clip_token(options: VideoOptions, span: ClipSpan | None) -> str:
    """A whole video's clip: its options' token, as it always was; a stretch of it: the
    frames it spans besides."""
    if span is None:
        return options.cache_token()
    token = json.loads(options.cache_token())
    return json.dumps({**token, "frames": [span.first, span.stop]}, sort_keys=True)


def audio_token(span: TimeSpan | None, options: AudioOptions) -> str:
    window = None if span is None else [round(span.start, 6), round(span.end, 6)]
    return json.dumps({"sample_rate": options.rate, "span": window}, sort_keys=True)
