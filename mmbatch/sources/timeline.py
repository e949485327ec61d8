"""Requests from parts of videos and audio files: one per sampled frame, one per audio window.

Expanding a video into frame requests needs to know its frames, so these sources index each
video (demux only, no decoding: see ``mmbatch.media.video``) and probe each audio file's
duration. Nothing is decoded here; the loader decodes the frames of a video together.

A file that cannot be expanded (no video stream, a timestamp past its end) still becomes
exactly one request, carrying its error (``Request.error``): that is the file's row, and the
job goes on.

Ids: ``clip.mp4@12.500`` for a frame (the file, then the frame's time in seconds), and
``talk.wav@30.000`` for an audio window, every window of a file cut in several, the first
(``@0.000``) included; a file short enough for one window keeps its own id (its path).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmbatch.errors import ItemFailure, MediaError
from mmbatch.jsonl import printable
from mmbatch.media.options import AudioOptions, VideoOptions
from mmbatch.sources.files import (
    AUDIO_SUFFIXES,
    IMAGE_SUFFIXES,
    VIDEO_SUFFIXES,
    InputFile,
    SourcePolicy,
    list_inputs,
    path_id,
)
from mmbatch.sources.log import ListingLog
from mmbatch.sources.paths import PathNotAllowed
from mmbatch.types import FrameAt, ItemError, Request

if TYPE_CHECKING:
    from mmbatch.media.video import VideoIndex

Columns = tuple[tuple[str, Any], ...]


def frame_requests(
    inputs: Sequence[str],
    options: VideoOptions,
    prompt: str,
    system: str | None = None,
    policy: SourcePolicy | None = None,
    log: ListingLog | None = None,
    save_dir: str | None = None,
) -> list[Request]:
    """One image request per frame that ``options`` samples from each video in ``inputs``:
    every frame asked for, each once, unless ``options.max_frames`` cuts them. Noted in
    ``log``: asks that fall on fewer distinct frames, a cut, a truncated video.

    Rows carry ``video``, ``frame_index`` (in presentation order), ``pts`` (seconds),
    ``warning`` when the file holds less than its header declares (``VideoIndex.truncation``)
    and, when the frames are saved to ``save_dir`` (``MediaOptions.frame_dir``),
    ``frame_path``: the file the frame is written to.
    """
    from mmbatch.media.decode import frame_file_name

    log = log if log is not None else ListingLog()
    requests: list[Request] = []
    for file in list_inputs(inputs, VIDEO_SUFFIXES, policy, "video", log):
        path, text = file.path, file.prompt or prompt
        try:
            file.check_allowed()
            index, frames = _frames_taken(file, options, log)
        except (MediaError, PathNotAllowed) as exc:
            failed: Columns = (("video", path), ("frame_index", None), ("pts", None))
            failed += (("frame_path", None),) * (save_dir is not None) + file.columns
            ref = file.ref("image")
            error = _error(exc)
            requests.append(
                Request(path_id(path), text, (ref,), system, columns=failed, error=error)
            )
            continue
        # A truncated file's frames are the right frames, but not all the video had: say so
        # on each of its rows.
        flag: Columns = (("warning", index.truncation),) if index.truncation else ()
        for i in frames:
            pts = index.seconds(i)
            ref = file.ref("image", FrameAt(i, pts))
            columns: Columns = (("video", path), ("frame_index", i), ("pts", round(pts, 6)), *flag)
            if save_dir is not None:
                columns += (("frame_path", str(Path(save_dir) / frame_file_name(path, pts))),)
            columns += file.columns
            requests.append(Request(frame_id(path, pts), text, (ref,), system, columns=columns))
    return _unique_frame_ids(requests)


def _frames_taken(
    file: InputFile, options: VideoOptions, log: ListingLog
) -> tuple[VideoIndex, list[int]]:
    """The video's index and the frames taken from it: every one ``options`` samples, each
    once, unless ``options.max_frames`` cuts them. Noted in ``log``: fewer distinct frames
    than were asked for (a rate above the video's), a cut, a truncated file."""
    from mmbatch.media.video import sample_frames, spread

    path = file.path
    index = index_of_video(file, options.max_source_pixels)
    sample = sample_frames(index, options)
    asked = sample.frames
    if sample.asked > len(asked):
        log.note(
            f"{printable(path)}: {sample.asked} frames asked for fall on {len(asked)} "
            "distinct frames, each taken once"
        )
    frames = asked if options.max_frames is None else spread(asked, options.max_frames)
    if len(frames) < len(asked):
        log.note(
            f"{printable(path)}: {len(asked)} frames sampled, {len(frames)} taken "
            f"(spread evenly) by max_frames {options.max_frames}"
        )
    if index.truncation:
        log.note(f"{printable(path)}: {index.truncation} (its rows carry this warning)")
    return index, frames


def index_of_video(file: InputFile, max_source_pixels: int) -> VideoIndex:
    """The index of the video ``file`` (``index_video``), which a source reads while
    listing; a still image named as a video is refused as what it is."""
    from mmbatch.media.video import index_video

    if Path(file.path).suffix.lower() in IMAGE_SUFFIXES:
        # PyAV opens a still image as a one-frame "video", whose frame then fails to decode
        # by seeking: say what the file is instead.
        raise MediaError(
            "a still image, not a video: caption pictures with `mmbatch caption`",
            stage="source",
            kind="unsupported",
        )
    return index_video(file.local_file(), max_source_pixels, file.pinned)


def clip_cap_note(options: VideoOptions) -> str | None:
    """What the clip cap (``VideoOptions.clip_max_frames``) does to clips sampled by
    ``options``, or None when it cannot cut anything: said in the summary of a clip job, since
    the loader, which meets each video, thins its clip without a word on its row."""
    cap = options.clip_max_frames
    if options.sampling == "num_frames" and options.num_frames > cap:
        asked = f"num_frames {options.num_frames}"
    elif options.sampling == "timestamps" and len(options.timestamps) > cap:
        asked = f"{len(options.timestamps)} timestamps"
    elif options.sampling == "fps":
        return (
            f"clips sampled at {options.fps:g} fps take at most {cap} frames (max_frames): "
            f"a video longer than {cap / options.fps:g} s has {cap} of its frames spread evenly"
        )
    elif options.sampling == "keyframes":
        return (
            f"clips take at most {cap} key frames (max_frames): a video with more has {cap} "
            "of them spread evenly"
        )
    else:
        return None
    return f"{asked} is over the clip cap of {cap} frames (max_frames): each clip takes {cap}"


def frame_id(video: str, pts: float, index: int | None = None) -> str:
    """``clip.mp4@12.500``: the video, then the frame's time; ``#index`` only if needed."""
    return f"{path_id(video)}@{pts:.3f}" + (f"#{index}" if index is not None else "")


def _unique_frame_ids(requests: list[Request]) -> list[Request]:
    """Frames less than a millisecond apart share a time at three decimals: those (and only
    those) get their index appended, so ids stay unique and short."""
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.id] = counts.get(r.id, 0) + 1
    unique = []
    for r in requests:
        part = r.media[0].part
        if counts[r.id] > 1 and isinstance(part, FrameAt):
            r = Request(
                frame_id(r.media[0].source, part.pts, part.index),
                r.prompt,
                r.media,
                r.system,
                columns=r.columns,
            )
        unique.append(r)
    return unique


def audio_requests(
    inputs: Sequence[str],
    options: AudioOptions,
    prompt: str,
    system: str | None = None,
    policy: SourcePolicy | None = None,
    log: ListingLog | None = None,
) -> list[Request]:
    """One audio request per window of each audio file in ``inputs`` (rows carry ``start``
    and ``end`` in seconds)."""
    requests: list[Request] = []
    for file in list_inputs(inputs, AUDIO_SUFFIXES, policy, "audio file", log):
        requests.extend(audio_file_requests(file, file.prompt or prompt, system, options))
    return requests


def audio_file_requests(
    file: InputFile, prompt: str, system: str | None, options: AudioOptions
) -> Iterator[Request]:
    """The requests of one audio file, one per window (``audio_windows``: its spans)."""
    from mmbatch.media.audio import audio_windows, probe_audio

    try:
        file.check_allowed()
        duration = probe_audio(file.local_file(), file.pinned).duration
    except (MediaError, PathNotAllowed) as exc:
        columns: Columns = (("start", None), ("end", None))
        ref = file.ref("audio")
        columns += file.columns
        yield Request(file.id, prompt, (ref,), system, columns=columns, error=_error(exc))
        return
    spans = audio_windows(duration, options)
    for span in spans:
        item_id = file.id if len(spans) == 1 else f"{file.id}@{span.start:.3f}"
        columns = (("start", span.start), ("end", span.end), *file.columns)
        yield Request(item_id, prompt, (file.ref("audio", span),), system, columns=columns)


def _error(exc: ItemFailure) -> ItemError:
    return ItemError(exc.stage, str(exc), exc.kind)
