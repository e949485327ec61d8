"""Videos cut into clips, a request each, the way video2dataset's users cut them: clips of N
seconds, one starting every S seconds (``--clip-seconds``, ``--stride``), or one per scene
(``--scenes``, FFmpeg's scene score: ``mmbatch.media.scenes``), or scenes cut further into
clips of at most N seconds. Each clip goes to the model as a video (its frames sampled as
``--num-frames``, ``--fps`` or ``--keyframes`` sample a whole video: ``VideoIndex.between``),
or as one picture: its middle frame, or its key frame (``--clip-frame``).

A clip is frames ``[first, stop)`` of the video (``ClipSpan``), worked out from the frames'
own timestamps in the stream's units, as ``--fps`` is: a clip starting at ``t`` holds every
frame shown from ``t`` (its time at or after ``t``) until ``t + N``. The grid starts at the
video's first frame (at a scene's first frame for a scene); the last clip is the first
whose end reaches the video's (or the scene's) end, and may be shorter; a clip that would
hold no frame (a gap in a variable-rate video, or a stride longer than the clip) is left out.

Ids: ``talk.mp4@12.500``, the video's id then the clip's start in seconds, as audio windows
are named; a video that makes one clip keeps its own id. The same video, options and FFmpeg
cut the same clips on every run, so a job resumes by these ids.

Videos are indexed (and, for scenes, decoded once, on FFmpeg's threads) while the inputs are
listed, before the engine starts: the clips are the job's items, which resume needs to know.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

from mmbatch.errors import ConfigError, ItemFailure
from mmbatch.media.options import VideoOptions
from mmbatch.media.scenes import DEFAULT_MIN_SCENE_SECONDS, DEFAULT_SCENE_THRESHOLD
from mmbatch.sources.files import VIDEO_SUFFIXES, InputFile, SourcePolicy, list_inputs
from mmbatch.sources.log import ListingLog
from mmbatch.sources.timeline import index_of_video
from mmbatch.types import ClipSpan, FrameAt, ItemError, Modality, Request

if TYPE_CHECKING:
    from mmbatch.media.video import VideoIndex

ClipFrame = Literal["middle", "keyframe"]
"""A clip given as one picture: the frame on screen at its middle, or its key frame nearest
the middle (decoded without the frames before it)."""


@dataclass(frozen=True)
class ClipSplit:
    """How each video is cut into clips, each its own row: every ``seconds`` (a clip starting
    every ``stride`` seconds, back to back by default), at its scene changes (``scenes``),
    or both (scenes longer than ``seconds`` cut further). ``frame`` gives each clip to the
    model as one picture instead of a video."""

    seconds: float | None = None
    stride: float | None = None
    """Seconds from one clip's start to the next's (None: ``seconds``): less than
    ``seconds`` overlaps the clips, more leaves gaps between them."""
    scenes: bool = False
    scene_threshold: float = DEFAULT_SCENE_THRESHOLD
    min_scene_seconds: float = DEFAULT_MIN_SCENE_SECONDS
    frame: ClipFrame | None = None

    def __post_init__(self) -> None:
        if self.seconds is None and not self.scenes:
            raise ConfigError("cutting clips needs clip seconds, scenes, or both")
        if self.seconds is not None and not self.seconds > 0:
            raise ConfigError(f"clip seconds must be > 0, got {self.seconds}")
        if self.stride is not None:
            if self.seconds is None:
                raise ConfigError("a stride needs clip seconds: the length of each clip")
            if not self.stride > 0:
                raise ConfigError(f"stride must be > 0, got {self.stride}")
        if not 0 < self.scene_threshold <= 1:
            raise ConfigError(f"scene threshold must be in (0, 1], got {self.scene_threshold}")
        if not self.min_scene_seconds >= 0:
            raise ConfigError(f"min scene seconds must be >= 0, got {self.min_scene_seconds}")
        if self.frame not in (None, "middle", "keyframe"):
            raise ConfigError(f"clip frame must be middle or keyframe, got {self.frame!r}")

    @property
    def step(self) -> float | None:
        """Seconds from one clip's start to the next's, within a video or a scene."""
        return self.stride if self.stride is not None else self.seconds


@dataclass(frozen=True)
class CutVideo:
    """A video's index and the clips cut from it."""

    index: VideoIndex
    spans: list[ClipSpan]
    scene_changes: int = 0


def clip_requests(
    inputs: Sequence[str],
    split: ClipSplit,
    prompt: str,
    system: str | None = None,
    policy: SourcePolicy | None = None,
    log: ListingLog | None = None,
    options: VideoOptions | None = None,
) -> list[Request]:
    """One request per clip ``split`` cuts from each video in ``inputs``: a video (frames
    sampled from the clip by the job's ``VideoOptions``), or with ``split.frame`` one
    picture. Rows carry ``start`` and ``end`` (seconds), a picture's ``frame_index`` and
    ``pts``, and ``warning`` for a video that holds less than its header declares.
    ``options`` gives the cap on the frames' pixels checked before decoding."""
    log = log if log is not None else ListingLog()
    files = list_inputs(inputs, VIDEO_SUFFIXES, policy, "video", log)
    cuts = cut_videos(files, split, options or VideoOptions(), log)
    requests: list[Request] = []
    for file in files:
        requests += video_clips(file, cuts[file.path], file.prompt or prompt, system, split)
    return requests


def cut_videos(
    files: Sequence[InputFile], split: ClipSplit, options: VideoOptions, log: ListingLog
) -> dict[str, CutVideo | ItemFailure]:
    """Each file's clips (or what made it unusable), by path; what was cut is said in
    ``log``."""

    def cut(file: InputFile) -> CutVideo | ItemFailure:
        try:
            file.check_allowed()
            index = index_of_video(file, options.max_source_pixels)
            return _cut(file.local_file(), index, split)
        except ItemFailure as exc:  # a path refused, a file that is no video
            return exc

    found = {f.path: cut(f) for f in files}
    _note(found, split, log)
    return found


def _cut(path: str, index: VideoIndex, split: ClipSplit) -> CutVideo:
    cuts: list[int] = []
    if split.scenes:
        from mmbatch.media.scenes import scene_cuts

        cuts = scene_cuts(path, index, split.scene_threshold, split.min_scene_seconds)
    return CutVideo(index, clip_spans(index, split, cuts), len(cuts))


def _note(found: dict[str, CutVideo | ItemFailure], split: ClipSplit, log: ListingLog) -> None:
    from mmbatch.jsonl import printable

    cut = [c for c in found.values() if isinstance(c, CutVideo)]
    if not cut:
        return
    clips = sum(len(c.spans) for c in cut)
    how = []
    if split.scenes:
        changes = sum(c.scene_changes for c in cut)
        how.append(f"{changes} scene changes (scene score above {split.scene_threshold:g})")
    if split.seconds is not None:
        how.append(f"clips of {split.seconds:g} s every {split.step:g} s")
    videos = f"{len(cut)} video" + ("s" if len(cut) != 1 else "")
    log.note(f"{videos} cut into {clips} clips: {', '.join(how)}")
    if split.frame == "keyframe":
        none = sum(1 for c in cut for s in c.spans if not _keyframes_in(c.index, s))
        if none:
            log.note(f"{none} clips hold no key frame: their middle frame is taken")
    for path, c in found.items():
        if isinstance(c, CutVideo) and c.index.truncation:
            log.note(f"{printable(path)}: {c.index.truncation} (its rows carry this warning)")


def clip_spans(index: VideoIndex, split: ClipSplit, cuts: Sequence[int] = ()) -> list[ClipSpan]:
    """The clips ``split`` cuts from the video ``index`` describes, whose scenes start at
    the frames ``cuts`` (ascending; empty: one scene), in order."""
    bounds = [0, *(c for c in cuts if 0 < c < len(index.pts)), len(index.pts)]
    spans: list[ClipSpan] = []
    for first, stop in pairwise(bounds):
        if first < stop:
            spans += _pieces(index, first, stop, split)
    return spans


def _pieces(index: VideoIndex, first: int, stop: int, split: ClipSplit) -> list[ClipSpan]:
    """Frames ``[first, stop)`` (a scene, or the whole video) as clips: whole, or of
    ``split.seconds`` every ``split.step`` seconds, in exact arithmetic on the frames' pts."""
    pts, base = index.pts, index.time_base
    end = Fraction(pts[stop] if stop < len(pts) else index.end_pts)  # when it stops showing
    if split.seconds is None or split.step is None:
        return [ClipSpan(first, stop, float(pts[first] * base), float(end * base))]
    length = Fraction(str(split.seconds)) / base  # in the stream's units
    step = Fraction(str(split.step)) / base
    pieces: list[ClipSpan] = []
    begin = Fraction(pts[first])
    while begin < end:
        finish = begin + length
        # The frames shown from `begin` until `finish`: a pts p (an integer) is at or after
        # a time x exactly when p >= ceil(x).
        a = bisect.bisect_left(pts, math.ceil(begin), first, stop)
        b = bisect.bisect_left(pts, math.ceil(finish), first, stop)
        if a < b:
            last = min(finish, end)
            pieces.append(ClipSpan(a, b, float(begin * base), float(last * base)))
        if finish >= end:
            break
        begin += step
    return pieces


def video_clips(
    file: InputFile,
    cut: CutVideo | ItemFailure,
    prompt: str,
    system: str | None,
    split: ClipSplit,
) -> Iterator[Request]:
    """The requests of one video's clips (``cut_videos``); a video that could not be cut
    is one request carrying its error."""
    columns: tuple[tuple[str, Any], ...]
    modality: Modality = "image" if split.frame else "video"
    if not isinstance(cut, CutVideo):
        columns = (("start", None), ("end", None))
        if split.frame:
            columns += (("frame_index", None), ("pts", None))
        error = ItemError(cut.stage, str(cut), cut.kind)
        ref = file.ref(modality)
        yield Request(file.id, prompt, (ref,), system, columns=columns + file.columns, error=error)
        return
    index, spans = cut.index, cut.spans
    flag = (("warning", index.truncation),) if index.truncation else ()
    ids = _clip_ids(file.id, spans)
    for span, item_id in zip(spans, ids, strict=True):
        columns = (("start", round(span.start, 6)), ("end", round(span.end, 6)))
        if split.frame:
            i = pick_frame(index, span, split.frame)
            pts = index.seconds(i)
            columns += (("frame_index", i), ("pts", round(pts, 6)))
            ref = file.ref("image", FrameAt(i, pts))
        else:
            ref = file.ref("video", span)
        columns += flag + file.columns
        yield Request(item_id, prompt, (ref,), system, columns=columns)


def _clip_ids(video_id: str, spans: Sequence[ClipSpan]) -> list[str]:
    """``video@start`` per clip (the video's own id for its only clip); starts less than a
    millisecond apart get their first frame's index appended, so ids stay unique."""
    if len(spans) == 1:
        return [video_id]
    ids = [f"{video_id}@{span.start:.3f}" for span in spans]
    counts = Counter(ids)
    return [i if counts[i] == 1 else f"{i}#{s.first}" for i, s in zip(ids, spans, strict=True)]


def pick_frame(index: VideoIndex, span: ClipSpan, frame: ClipFrame) -> int:
    """The one frame a clip is given as: the frame on screen at its middle, or its key
    frame nearest that (the middle one when it holds none)."""
    middle = min(max(index.frame_at((span.start + span.end) / 2), span.first), span.stop - 1)
    keys = _keyframes_in(index, span)
    if frame == "middle" or not keys:
        return middle
    return min(keys, key=lambda k: (abs(index.pts[k] - index.pts[middle]), k))


def _keyframes_in(index: VideoIndex, span: ClipSpan) -> list[int]:
    low = bisect.bisect_left(index.keyframes, span.first)
    high = bisect.bisect_left(index.keyframes, span.stop)
    return list(index.keyframes[low:high])
