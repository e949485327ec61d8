"""Requests from videos and audio: one per sampled frame, one per clip, one per audio window.

Expanding a video into frame requests needs to know its frames, so these sources index each
video (demux only, no decoding: see ``mmbatch.media.video``) and probe each audio file's
duration. Nothing is decoded here; the loader decodes the frames of a video together.

A file that cannot be expanded (no video stream, a timestamp past its end) still becomes
exactly one request, whose media is marked ``Unreadable``: the loader turns it into that
file's error row, and the job goes on.

Ids: ``clip.mp4@12.500`` for a frame (the file, then the frame's time in seconds),
``talk.wav@30.000`` for an audio window after the first (the first keeps the file's name, so
a short file's id is its path).
"""

from __future__ import annotations

import glob
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from mmbatch.config import AudioOptions, VideoOptions
from mmbatch.errors import MediaError, SourceError
from mmbatch.sources import (
    AUDIO_SUFFIXES,
    IMAGE_SUFFIXES,
    VIDEO_SUFFIXES,
    SourcePolicy,
    expand_inputs,
)
from mmbatch.types import FrameAt, MediaRef, Modality, Request, Unreadable

Columns = tuple[tuple[str, Any], ...]


def frame_requests(
    inputs: Sequence[str], options: VideoOptions, prompt: str, system: str | None = None
) -> list[Request]:
    """One image request per frame that ``options`` samples from each video in ``inputs``.

    Rows carry ``video``, ``frame_index`` (in presentation order) and ``pts`` (seconds).
    """
    from mmbatch.media.video import index_video, select_frames

    requests: list[Request] = []
    for _, path, row_prompt in _files(inputs, VIDEO_SUFFIXES, "video"):
        text = row_prompt or prompt
        try:
            index = index_video(path)
            frames = select_frames(index, options)
        except MediaError as exc:
            ref = MediaRef("image", path, part=Unreadable(str(exc), exc.stage, exc.kind))
            failed: Columns = (("video", path), ("frame_index", None), ("pts", None))
            requests.append(Request(path, text, (ref,), system, columns=failed))
            continue
        for i in frames:
            pts = index.seconds(i)
            ref = MediaRef("image", path, part=FrameAt(i, pts))
            columns = (("video", path), ("frame_index", i), ("pts", round(pts, 6)))
            requests.append(Request(frame_id(path, pts), text, (ref,), system, columns=columns))
    return _unique_frame_ids(requests)


def frame_id(video: str, pts: float, index: int | None = None) -> str:
    """``clip.mp4@12.500``: the video, then the frame's time; ``#index`` only if needed."""
    return f"{video}@{pts:.3f}" + (f"#{index}" if index is not None else "")


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
    inputs: Sequence[str], options: AudioOptions, prompt: str, system: str | None = None
) -> list[Request]:
    """One audio request per window of each audio file in ``inputs`` (rows carry ``start``
    and ``end`` in seconds)."""
    requests: list[Request] = []
    for _, path, row_prompt in _files(inputs, AUDIO_SUFFIXES, "audio file"):
        requests.extend(_audio_windows(path, row_prompt or prompt, system, options))
    return requests


def _audio_windows(
    path: str, prompt: str, system: str | None, options: AudioOptions
) -> Iterator[Request]:
    from mmbatch.media.audio import audio_windows, probe_audio

    try:
        duration = probe_audio(path).duration
    except MediaError as exc:
        ref = MediaRef("audio", path, part=Unreadable(str(exc), exc.stage, exc.kind))
        yield Request(path, prompt, (ref,), system, columns=(("start", None), ("end", None)))
        return
    for n, span in enumerate(audio_windows(duration, options)):
        item_id = path if n == 0 else f"{path}@{span.start:.3f}"
        columns = (("start", span.start), ("end", span.end))
        yield Request(
            item_id, prompt, (MediaRef("audio", path, part=span),), system, columns=columns
        )


def caption_requests(
    inputs: Sequence[str],
    prompt: str,
    system: str | None = None,
    *,
    take: Collection[Modality] = ("image", "audio"),
    as_clip: bool = False,
    audio: AudioOptions | None = None,
    policy: SourcePolicy | None = None,
) -> list[Request]:
    """Requests for ``mmbatch caption``: the modality of each file picked by its suffix.

    Images are one request each, audio files one per window, videos one clip each when
    ``as_clip``. ``take`` is what the model accepts: folders and globs contribute only those
    files (a photo folder's stray wav is not the VL model's business), while a file named
    explicitly that the model cannot take, or a video without ``as_clip``, gets an error row
    saying so.
    """
    audio = audio or AudioOptions()
    wanted = set(take) - ({"video"} if not as_clip else set())
    suffixes = IMAGE_SUFFIXES | AUDIO_SUFFIXES | VIDEO_SUFFIXES
    requests: list[Request] = []
    for item_id, path, row_prompt, walked in _files_walked(inputs, suffixes, "media file", policy):
        text = row_prompt or prompt
        kind = modality_of(path)
        if kind not in wanted:
            if walked:
                continue
            if kind == "video" and not as_clip:
                why = (
                    "a video: caption it whole with --as-clip, or its frames with `mmbatch frames`"
                )
            else:
                why = f"the model takes no {kind} input"
            ref = MediaRef(kind, path, part=Unreadable(why, "validate", "unsupported"))
            requests.append(Request(item_id, text, (ref,), system))
        elif kind == "audio":
            requests.extend(_audio_windows(path, text, system, audio))
        else:
            requests.append(Request(item_id, text, (MediaRef(kind, path),), system))
    if not requests:
        kinds = " or ".join(sorted(wanted)) or "media"
        raise SourceError(f"no {kinds} the model takes found in {', '.join(map(repr, inputs))}")
    return requests


def modality_of(path: str) -> Modality:
    """The modality a file's suffix names (anything unknown is tried as an image)."""
    suffix = Path(path).suffix.lower()
    if suffix in VIDEO_SUFFIXES:
        return "video"
    if suffix in AUDIO_SUFFIXES:
        return "audio"
    return "image"


def modalities_in(requests: Sequence[Request]) -> dict[Modality, int]:
    """The most items of each modality any one request carries: the engine's
    ``media_per_prompt``, so vLLM reserves memory only for media the job sends."""
    limits: dict[Modality, int] = {}
    for request in requests:
        counts: dict[Modality, int] = {}
        for ref in request.media:
            if isinstance(ref.part, Unreadable):
                continue  # never sent: a model that cannot take it must not be asked to
            counts[ref.modality] = counts.get(ref.modality, 0) + 1
        for modality, count in counts.items():
            limits[modality] = max(limits.get(modality, 0), count)
    return limits


def _files(
    inputs: Sequence[str], suffixes: frozenset[str], kind: str
) -> Iterator[tuple[str, str, str | None]]:
    """The distinct files of ``inputs`` (a file reached twice is one item)."""
    for item_id, path, prompt, _ in _files_walked(inputs, suffixes, kind):
        yield item_id, path, prompt


def _files_walked(
    inputs: Sequence[str],
    suffixes: frozenset[str],
    kind: str,
    policy: SourcePolicy | None = None,
) -> Iterator[tuple[str, str, str | None, bool]]:
    """``_files``, each also saying whether a folder or glob found it (``walked``) rather
    than the user naming it (directly or in a manifest)."""
    seen: set[str] = set()
    for raw in inputs:
        walked = Path(raw).is_dir() or (not Path(raw).exists() and glob.has_magic(raw))
        for item_id, path, row_prompt in expand_inputs([raw], suffixes, policy):
            if item_id in seen:
                if item_id == path:
                    continue
                raise SourceError(f"duplicate id {item_id!r} in the inputs; ids must be unique")
            seen.add(item_id)
            yield item_id, path, row_prompt, walked
    if not seen:
        raise SourceError(f"no {kind} found in {', '.join(map(repr, inputs))}")
