"""Small JPEG previews as ``data:`` URIs, so the review gallery is one self-contained file.

A picture becomes one thumbnail (EXIF orientation applied, transparency over white); a video
becomes a strip of a few frames sampled across its length. Anything that cannot be previewed
(a missing file, a corrupt picture, audio) raises ``NoPreview`` with the reason, which the
gallery shows in its place: a preview must never stop the report.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import TYPE_CHECKING

from mmbatch.media.fetch import read_source
from mmbatch.media.image import decode_image, prepare_decoded
from mmbatch.media.options import ImageOptions
from mmbatch.sources.files import VIDEO_SUFFIXES
from mmbatch.types import FrameAt, MediaRef, TimeSpan

if TYPE_CHECKING:
    from PIL import Image

THUMBNAIL_SIDE = 192
"""Thumbnails hold at most this side squared in pixels (the page shows them within it)."""
THUMBNAIL_OPTIONS = ImageOptions(max_pixels=THUMBNAIL_SIDE * THUMBNAIL_SIDE)
"""Decoded the way the model's input is (EXIF applied, transparency over white, size capped
before decoding), then shrunk."""
VIDEO_FRAMES = 4
"""Frames sampled across a video for its strip."""


class NoPreview(Exception):
    """Why an item has no thumbnail; the gallery shows the reason in its place."""


def thumbnail_uri(ref: MediaRef) -> str:
    """A ``data:image/jpeg;base64,...`` preview of ``ref``; ``NoPreview`` says why not."""
    path = Path(ref.source)
    if ref.image is None and ref.data is None and not path.is_file():
        raise NoPreview(f"no file at {ref.source}")
    if ref.modality == "audio":
        raise NoPreview("audio has no picture")
    try:
        if ref.image is not None:
            return _to_uri(prepare_decoded(ref.image, THUMBNAIL_OPTIONS))
        if ref.data is not None:
            return _to_uri(decode_image(ref.data, THUMBNAIL_OPTIONS))
        if isinstance(ref.part, FrameAt):
            return _to_uri(_video_frame(path, ref.part))
        if isinstance(ref.part, TimeSpan):
            return _to_uri(_strip(path, ref.part))
        if ref.modality == "video" or path.suffix.lower() in VIDEO_SUFFIXES:
            return _to_uri(_strip(path))
        return _to_uri(
            decode_image(read_source(ref.source, None, pinned=ref.pinned), THUMBNAIL_OPTIONS)
        )
    except Exception as exc:  # Pillow and PyAV raise many types; each is a reason to show
        raise NoPreview(f"{type(exc).__name__}: {exc}") from None


def _video_frame(path: Path, frame: FrameAt) -> Image.Image:
    """The one frame a frame job's row names (found by its index, checked by its time)."""
    from PIL import Image

    from mmbatch.media.video import decode_frames, index_video

    index = index_video(str(path))
    if frame.index >= len(index.pts) or abs(index.seconds(frame.index) - frame.pts) > 1e-3:
        raise ValueError(f"{path} has no frame {frame.index} at {frame.pts:.3f} s")
    rgb = decode_frames(str(path), index, [frame.index]).frames[frame.index]
    return prepare_decoded(Image.fromarray(rgb), THUMBNAIL_OPTIONS)


def _strip(path: Path, span: TimeSpan | None = None) -> Image.Image:
    """Up to ``VIDEO_FRAMES`` frames spread over the video, or over a clip cut from it (a
    row's ``start`` to ``end``), side by side: the frames on screen at the middles of equal
    slices of it, found by the video's index (every frame's time, from demuxing), so none is
    from before the clip, and none is misplaced where the header's duration or a seek by
    time is off (an MPEG program stream's duration is a guess from its bit rate)."""
    from PIL import Image

    from mmbatch.media.video import decode_frames, index_video

    index = index_video(str(path))
    start, end = (span.start, span.end) if span is not None else (index.start, index.end)
    step = (end - start) / VIDEO_FRAMES
    wanted = sorted({index.frame_at(start + (k + 0.5) * step) for k in range(VIDEO_FRAMES)})
    decoded = decode_frames(str(path), index, wanted, THUMBNAIL_SIDE * THUMBNAIL_SIDE).frames
    frames = [prepare_decoded(Image.fromarray(decoded[i]), THUMBNAIL_OPTIONS) for i in wanted]
    return _side_by_side(frames, path)


def _side_by_side(frames: list[Image.Image], path: Path) -> Image.Image:
    from PIL import Image

    if not frames:
        raise ValueError(f"{path}: no frame decoded")
    strip = Image.new(
        "RGB", (sum(f.width for f in frames), max(f.height for f in frames)), (255, 255, 255)
    )
    x = 0
    for frame in frames:
        strip.paste(frame, (x, 0))
        x += frame.width
    return strip


def _to_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
