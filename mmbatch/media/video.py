"""Sample frames from a video with PyAV, decoding only what the sample needs.

Two passes over the file, for two different costs:

1. ``index_video`` demuxes the stream *without decoding*: every packet's presentation time
   and key-frame flag. Demuxing an hour of video reads the file but decodes nothing, so it
   costs a fraction of one decode pass, and it makes the sample exact: each sampled frame
   has its true index in presentation order and its true time, also under a variable frame
   rate, and we know where the key frames are.
2. ``decode_frames`` then decodes the wanted frames in one pass, seeking to the last key
   frame before a wanted frame whenever one lies ahead of the decoder, instead of decoding
   everything in between. Eight frames from an hour decode eight short GOPs, not the hour.

Frames come out as RGB ``uint8`` arrays turned upright by the stream's display matrix
(phones store portrait video as landscape plus a rotation) and optionally scaled down.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from mmbatch.errors import MediaError
from mmbatch.media.container import av_errors, av_reason, open_media, stream_kinds, threaded
from mmbatch.media.options import DEFAULT_MAX_VIDEO_PIXELS, VideoOptions, scaled_size
from mmbatch.types import FileId

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class VideoIndex:
    """What demuxing (no decoding) tells us about a video's first video stream."""

    pts: tuple[int, ...]
    """Every frame's presentation time in ``time_base`` units, in presentation order."""
    time_base: Fraction
    keyframes: tuple[int, ...]
    """Indices into ``pts`` of the key frames, ascending: where a decoder can start."""
    width: int
    height: int
    """The coded size, before rotation."""
    rotation: int
    """Counter-clockwise degrees the frames must be turned to be upright (0, 90, 180, 270)."""
    last_duration: int = 0
    """How long the last frame shows, in ``time_base`` units, as its packet declares (0: it
    declares none). FFmpeg's fps filter ends its sampling grid there."""
    declared_frames: int = 0
    """The frame count the container's header declares (0: it declares none)."""
    declared_seconds: float | None = None
    """The stream duration the container's header declares (None: it declares none)."""
    damaged_at: float | None = None
    """Where demuxing met damaged data and stopped (seconds), if it did."""
    offset: int = 0
    """The index of this index's first frame in the whole video: 0, except for a stretch
    cut out of it (``between``)."""
    pinned: FileId | None = None
    """The file the path rule checked (``MediaRef.pinned``): every decode by this index
    opens that very file."""

    def __post_init__(self) -> None:
        if not self.pts:
            raise MediaError("the video stream has no frames")

    def between(self, first: int, stop: int) -> VideoIndex:
        """Frames ``[first, stop)`` as a video of their own: a clip cut from this one, which
        every sampling then treats as a whole video (``num_frames`` spread over the clip,
        ``fps`` on a grid from its first frame, its own key frames). Its last frame shows
        until the next frame of this video. What this video's header declares is left out:
        a clip is not the file, and the file's truncation is said on its rows."""
        if not 0 <= first < stop <= len(self.pts):
            raise ValueError(f"frames [{first}, {stop}) are not within {len(self.pts)} frames")
        shown = self.pts[stop] - self.pts[stop - 1] if stop < len(self.pts) else self.last_duration
        return VideoIndex(
            pts=self.pts[first:stop],
            time_base=self.time_base,
            keyframes=tuple(k - first for k in self.keyframes if first <= k < stop),
            width=self.width,
            height=self.height,
            rotation=self.rotation,
            last_duration=shown,
            offset=self.offset + first,
            pinned=self.pinned,
        )

    def seconds(self, i: int) -> float:
        return float(self.pts[i] * self.time_base)

    @property
    def frame_gap(self) -> int:
        """The typical time between frames in ``time_base`` units (the median gap; 0 for a
        single frame)."""
        if len(self.pts) < 2:
            return 0
        gaps = sorted(b - a for a, b in zip(self.pts, self.pts[1:], strict=False))
        return gaps[len(gaps) // 2]

    @property
    def frame_seconds(self) -> float:
        """The typical time between frames (the median gap; 0 for a single frame)."""
        return float(self.frame_gap * self.time_base)

    @property
    def end_pts(self) -> int:
        """When the last frame stops showing, in ``time_base`` units: its pts plus its own
        duration, or plus the typical gap when its packet declares none (as FFmpeg's command
        line guesses a missing duration from the frame rate)."""
        return self.pts[-1] + (self.last_duration or self.frame_gap)

    @property
    def start(self) -> float:
        return self.seconds(0)

    @property
    def end(self) -> float:
        """When the last frame stops showing (its time plus a typical frame's duration)."""
        return self.seconds(len(self.pts) - 1) + self.frame_seconds

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def fps(self) -> float:
        """The average frame rate over the whole stream (variable rates included)."""
        return len(self.pts) / self.duration if self.duration > 0 else 1.0

    @property
    def display_size(self) -> tuple[int, int]:
        """``(width, height)`` as shown, after rotation."""
        if self.rotation in (90, 270):
            return self.height, self.width
        return self.width, self.height

    @property
    def truncation(self) -> str | None:
        """Why this file holds less video than its header declares, or None if it does not
        seem to. An mp4 whose index comes first, cut off mid-download, still opens and
        demuxes: as a shorter video, which nothing else would notice."""
        held = f"the file holds {len(self.pts)} frames ({self.end:.3f} s)"
        if self.damaged_at is not None:
            return f"damaged video: its data is unreadable after {self.damaged_at:.3f} s; {held}"
        if self.declared_frames > len(self.pts) + 1:
            return f"truncated video: its header declares {self.declared_frames} frames; {held}"
        slack = max(2 * self.frame_seconds, 0.05)
        if self.declared_seconds is not None and self.declared_seconds > self.end + slack:
            return f"truncated video: its header declares {self.declared_seconds:.3f} s; {held}"
        return None

    def frame_at(self, t: float) -> int:
        """The index of the frame on screen at ``t`` seconds: the last one shown by then
        (the first frame for times before it starts)."""
        target = t / self.time_base
        return max(0, bisect.bisect_right(self.pts, target) - 1)

    def keyframe_before(self, i: int) -> int:
        """The index of the last key frame at or before frame ``i`` (0 if none is marked)."""
        k = bisect.bisect_right(self.keyframes, i) - 1
        return self.keyframes[k] if k >= 0 else 0


def index_video(
    path: str, max_source_pixels: int = DEFAULT_MAX_VIDEO_PIXELS, pinned: FileId | None = None
) -> VideoIndex:
    """Demux the first video stream of ``path`` (the file ``pinned``, when given: see
    ``open_media``); raise ``MediaError`` if there is none, or if its frames are over
    ``max_source_pixels`` (checked on the header, before any frame is decoded: every later
    step decodes at that size)."""
    with open_media(path, pinned) as container:
        if not container.streams.video:
            raise MediaError(
                f"no video stream (streams: {stream_kinds(container)})", kind="unsupported"
            )
        stream = container.streams.video[0]
        check_frame_size(stream.codec_context.width, stream.codec_context.height, max_source_pixels)
        pts: list[int] = []
        key_pts: set[int] = set()
        durations: dict[int, int] = {}
        damaged = False
        try:
            for packet in container.demux(stream):
                stamp = packet.pts if packet.pts is not None else packet.dts
                if stamp is None or packet.size == 0:
                    continue  # the flush packet at the end
                pts.append(stamp)
                durations[stamp] = packet.duration or 0
                if packet.is_keyframe:
                    key_pts.add(stamp)
        except av_errors() as exc:
            if not pts:
                raise MediaError(f"cannot read the video stream: {av_reason(exc)}") from None
            # A damaged tail: keep the frames before it (flagged by ``truncation``).
            damaged = True
        ordered = sorted(set(pts))
        keyframes = tuple(i for i, p in enumerate(ordered) if p in key_pts)
        rotation = _first_frame_rotation(container, stream) if ordered else 0
        time_base = stream.time_base or Fraction(1, 1)
        return VideoIndex(
            pts=tuple(ordered),
            time_base=time_base,
            keyframes=keyframes or (0,),
            width=stream.codec_context.width,
            height=stream.codec_context.height,
            rotation=rotation,
            last_duration=durations.get(ordered[-1], 0) if ordered else 0,
            declared_frames=int(stream.frames or 0),
            declared_seconds=_declared_seconds(container, stream, time_base),
            damaged_at=float(ordered[-1] * time_base) if damaged and ordered else None,
            pinned=pinned,
        )


def _declared_seconds(container: Any, stream: Any, time_base: Fraction) -> float | None:
    """The video stream's duration as its header declares it: the stream's own (mp4), else,
    when the video is the container's only stream, the container's (Matroska, WebM). With
    other streams beside it, the container's duration is the longest one's, not the video's."""
    if stream.duration:
        return float(stream.duration * time_base)
    if container.duration and len(container.streams) == 1:
        return float(container.duration) / 1_000_000
    return None


def check_frame_size(width: int, height: int, max_source_pixels: int) -> None:
    """Refuse frames over ``max_source_pixels`` (``MediaError``, kind ``too_large``)."""
    if width * height > max_source_pixels:
        raise MediaError(
            f"video frames are {width}x{height} = {width * height} pixels, over the cap of "
            f"{max_source_pixels} (raise max_source_pixels if this is intended)",
            kind="too_large",
        )


def _first_frame_rotation(container: Any, stream: Any) -> int:
    """The display rotation, read from the first decoded frame (PyAV exposes the display
    matrix on frames), normalised to 0/90/180/270."""
    try:
        container.seek(0, stream=stream)
        for frame in container.decode(stream):
            return round(float(frame.rotation) / 90.0) * 90 % 360
    except av_errors():
        return 0
    return 0


def select_frames(index: VideoIndex, options: VideoOptions) -> list[int]:
    """The indices of the frames a clip takes: those ``options`` samples, at most
    ``options.clip_max_frames`` of them (spread evenly when the sampling asked for more)."""
    return spread(sample_frames(index, options).frames, options.clip_max_frames)


@dataclass(frozen=True)
class FrameSample:
    """The frames a sampling takes from one video, and how many it asked for."""

    frames: list[int]
    """Indices into the video's frames, ascending and distinct: each frame at most once."""
    asked: int
    """How many frames the sampling asked for: more than ``frames`` holds when several asks
    fall on one frame (a rate above the video's, timestamps within one frame)."""


def sample_frames(index: VideoIndex, options: VideoOptions) -> FrameSample:
    """Every frame ``options`` samples, uncapped, each once."""
    if options.sampling == "fps":
        return _rate_sample(index, options.fps)
    if options.sampling == "keyframes":
        if not index.keyframes:  # a clip cut between two key frames
            raise MediaError(
                f"no key frame between {index.start:.3f} and {index.end:.3f} s to sample: "
                "sample clips this short with num_frames or fps",
                kind="other",
            )
        return FrameSample(list(index.keyframes), len(index.keyframes))
    if options.sampling == "timestamps":
        late = [t for t in options.timestamps if t >= index.end]
        if late:
            raise MediaError(
                f"timestamp {late[0]:g} s is past the end of the video ({index.end:.3f} s)",
                kind="other",
            )
        chosen: Iterable[int] = (index.frame_at(t) for t in options.timestamps)
        asked = len(options.timestamps)
    else:
        asked = n = options.num_frames
        # The middle of each of n equal slices: symmetric, and never the black first frame.
        chosen = (index.frame_at(index.start + (k + 0.5) * index.duration / n) for k in range(n))
    return FrameSample(sorted(set(chosen)), asked)


def _rate_sample(index: VideoIndex, fps: float) -> FrameSample:
    """The frames FFmpeg's ``fps`` filter (defaults ``round=near``, ``eof_action=round``)
    outputs at ``fps``, each once, in exact integer arithmetic on the frames' own pts.

    The filter puts each frame on the output grid of ``1/fps`` by rounding its pts to the
    nearest slot (halves away from zero); the grid starts at the first frame's slot and ends
    before the slot of the stream's end (the last frame's pts plus its duration); each slot
    shows the last frame whose slot is at or before it. So a frame is taken when it is the
    last one rounded to its slot and that slot is before the end. One departure: a video
    whose end rounds to its first slot (one shorter than about half a step), of which the
    filter outputs nothing, still gives that slot's frame: its row would vanish unsaid.
    """
    rate = Fraction(fps).limit_denominator(2**31 - 1)  # as FFmpeg's av_d2q reads a rate
    num = index.time_base.numerator * rate.numerator
    den = index.time_base.denominator * rate.denominator

    def slot(pts: int) -> int:
        """``pts * time_base * rate``, rounded to the nearest integer, halves away from 0."""
        nearest = (2 * abs(pts) * num + den) // (2 * den)
        return nearest if pts >= 0 else -nearest

    slots = [slot(p) for p in index.pts]
    first = slots[0]
    end = max(slot(index.end_pts), first + 1)
    following = [*slots[1:], end]
    frames = [i for i, (s, t) in enumerate(zip(slots, following, strict=True)) if s < min(t, end)]
    return FrameSample(frames, end - first)


def spread(items: Sequence[int], limit: int) -> list[int]:
    """At most ``limit`` of ``items``, evenly spaced, first and last kept when possible."""
    if len(items) <= limit:
        return list(items)
    if limit == 1:
        return [items[len(items) // 2]]
    return [items[round(k * (len(items) - 1) / (limit - 1))] for k in range(limit)]


@dataclass
class DecodedFrames:
    """The frames one pass decoded: ``frames`` by index, and what it cost."""

    frames: dict[int, np.ndarray]
    decoded: int = 0
    """Frames the decoder produced, wanted or not: what seeking saves."""
    seeks: int = 0


def decode_frames(
    path: str, index: VideoIndex, wanted: Iterable[int], max_pixels: int | None = None
) -> DecodedFrames:
    """Decode the frames ``wanted`` (indices into ``index``) in one pass over ``path``.

    ``frames`` maps each wanted frame the file still holds to an HxWx3 uint8 RGB array; a
    frame missing from it was not decodable (a truncated or damaged file), which the caller
    reports. Seeks forward to a key frame whenever one lies between the decoder's position
    and the next wanted frame.
    """
    todo = sorted(set(wanted))
    result = DecodedFrames({})
    out = result.frames
    if not todo:
        return result
    position = {p: i for i, p in enumerate(index.pts)}
    width, height = scaled_size(index.width, index.height, max_pixels)
    with open_media(path, index.pinned) as container:
        stream = threaded(container.streams.video[0])
        at = -1  # index of the last frame decoded
        sought = -1  # the key frame of the last seek: never seek to it (or before) again
        while todo:
            key = index.keyframe_before(todo[0])
            if key > at and key > sought:
                container.seek(index.pts[key], stream=stream)
                sought = key
                result.seeks += 1
            advanced = False
            try:
                for frame in container.decode(stream):
                    result.decoded += 1
                    i = position.get(frame.pts)
                    if i is None:
                        continue
                    advanced = True
                    at = i
                    while todo and todo[0] < i:
                        todo.pop(0)  # passed without being decoded: missing
                    if todo and todo[0] == i:
                        out[i] = _to_rgb(frame, width, height, index.rotation)
                        todo.pop(0)
                    if not todo:
                        break
                    ahead = index.keyframe_before(todo[0])
                    if ahead > at + 1 and ahead > sought:
                        break  # cheaper to seek there than to decode the frames between
                else:
                    break  # the stream ended
            except av_errors():
                break  # damaged data: the frames not decoded so far are missing
            if not advanced:
                break
    return result


def _to_rgb(frame: Any, width: int, height: int, rotation: int) -> np.ndarray:
    import numpy as np

    if (frame.width, frame.height) != (width, height):
        frame = frame.reformat(width=width, height=height, interpolation="AREA")
    rgb: np.ndarray = frame.to_ndarray(format="rgb24")
    if rotation:
        rgb = np.ascontiguousarray(np.rot90(rgb, k=rotation // 90))
    return rgb


def clip_from(
    path: str,
    index: VideoIndex,
    indices: Sequence[int],
    max_pixels: int | None,
    whole: VideoIndex | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode ``indices`` of ``path`` into the ``(frames, metadata)`` clip vLLM takes.
    ``index`` is the clip's: the video's own, or a stretch of ``whole`` (``between``), the
    video's index, which the decoder seeks by. A file that holds less than its header
    declares is refused as a whole clip: it would be the part that is left, passed off as
    the whole video."""
    import numpy as np

    if index.truncation is not None:
        raise MediaError(f"{index.truncation}; a clip of it would miss the rest")

    video = whole or index
    shift = index.offset - video.offset
    frames = decode_frames(path, video, [shift + i for i in indices], max_pixels).frames
    missing = [i for i in indices if shift + i not in frames]
    if missing:
        raise MediaError(
            f"{len(missing)} of {len(indices)} sampled frames could not be decoded "
            f"(first at {index.seconds(missing[0]):.3f} s): truncated or damaged video"
        )
    metadata = {
        "total_num_frames": len(index.pts),
        "fps": index.fps,
        "duration": index.duration,
        "frames_indices": list(indices),
        "video_backend": "opencv",
        "do_sample_frames": False,
    }
    return np.stack([frames[shift + i] for i in indices]), metadata
