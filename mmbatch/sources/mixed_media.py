"""Media of every kind in one listing, each file made into requests by its kind (its suffix).

``list_media`` lists images, videos and audio files together; ``media_requests`` makes
their requests for a job that takes some kinds of media: images one request each, audio
files one per window, videos one clip each when asked to take them whole, or one per clip
cut from them (``mmbatch.sources.clips``). ``mmbatch caption``, a recipe over videos taken
whole, ``mmbatch report`` (which kind a row's file is) and the notebook's ``caption`` all
list their files here. What the job takes decides what a walk collects: a folder or glob
contributes only those files (a photo folder's stray wav is not the VL model's business),
while a file named explicitly that the job cannot take, or a video without ``as_clip``, gets
an error row saying so.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from mmbatch.errors import ItemFailure, SourceError
from mmbatch.media.options import MediaOptions
from mmbatch.sources.clips import ClipSplit, CutVideo, cut_videos, video_clips
from mmbatch.sources.files import (
    AUDIO_SUFFIXES,
    IMAGE_SUFFIXES,
    VIDEO_SUFFIXES,
    InputFile,
    SourcePolicy,
    list_inputs,
)
from mmbatch.sources.log import ListingLog
from mmbatch.sources.timeline import audio_file_requests
from mmbatch.types import ItemError, Modality, Request

MEDIA_SUFFIXES = IMAGE_SUFFIXES | AUDIO_SUFFIXES | VIDEO_SUFFIXES


def list_media(
    inputs: Sequence[str], policy: SourcePolicy | None = None, log: ListingLog | None = None
) -> list[InputFile]:
    """Every image, video and audio file of ``inputs``, once (what ``media_requests``
    takes; listing first lets a caller see which modalities the job holds)."""
    return list_inputs(inputs, MEDIA_SUFFIXES, policy, "media file", log)


@dataclass(frozen=True)
class Takes:
    """Which media a job takes, and how it takes its videos."""

    kinds: Collection[Modality] = ("image", "audio")
    as_clip: bool = False
    """Videos are taken whole, one clip each."""
    clips: ClipSplit | None = None
    """Videos are cut into clips, a request each (a clip given as a frame is a picture)."""
    by: str = "the model"
    """What decided it, named in the error row of a file it does not take ("the model", or
    a recipe reading one kind of media)."""

    @property
    def whole_videos(self) -> bool:
        """Videos are taken as clips (whole, or cut into several)."""
        return self.as_clip or self.clips is not None

    def wanted(self) -> set[Modality]:
        """The kinds of file made into requests: a video only as a clip, and only where its
        clips are a kind the job takes (a clip given as a frame is a picture)."""
        clip: Modality = "image" if self.clips is not None and self.clips.frame else "video"
        takes_clips = self.whole_videos and clip in self.kinds
        return set(self.kinds) - {"video"} | ({"video"} if takes_clips else set())


def media_requests(
    files: Sequence[InputFile],
    prompt: str | None,
    system: str | None = None,
    *,
    takes: Takes = Takes(),
    media: MediaOptions | None = None,
    log: ListingLog | None = None,
) -> list[Request]:
    """The requests of ``files`` (from ``list_media``) for a job that ``takes`` some kinds
    of media; walked files it does not take are counted in ``log``. ``media``: how audio is
    cut into windows, and the cap on a video clip's frames' pixels. ``prompt``: the question
    for every file without one of its own (None: ``DEFAULT_PROMPTS``' for its kind)."""
    media = media or MediaOptions()
    log = log if log is not None else ListingLog()
    wanted = takes.wanted()
    cuts: dict[str, CutVideo | ItemFailure] = {}
    if takes.clips is not None and "video" in wanted:
        videos = [f for f in files if f.refused is None and modality_of(f.path) == "video"]
        cuts = cut_videos(videos, takes.clips, media.video, log) if videos else {}
    requests: list[Request] = []
    for file in files:
        kind = modality_of(file.path)
        text = file.prompt or prompt or _default_prompt(kind, takes)
        if file.refused is not None or kind not in wanted:
            # A path its manifest may not name, or a kind the job does not take.
            error = file.refused or _not_wanted(file, kind, takes, log)
            if error is not None:
                ref = file.ref(kind)
                requests.append(
                    Request(file.id, text, (ref,), system, columns=file.columns, error=error)
                )
        elif kind == "audio":
            requests.extend(audio_file_requests(file, text, system, media.audio))
        elif kind == "video" and takes.clips is not None:
            requests.extend(video_clips(file, cuts[file.path], text, system, takes.clips))
        else:
            ref = file.ref(kind)
            requests.append(Request(file.id, text, (ref,), system, columns=file.columns))
    if not requests:
        kinds = " or ".join(sorted(wanted)) or "media"
        names = ", ".join(sorted({f.path for f in files})[:3])
        raise SourceError(f"no {kinds} the model takes found among {names}")
    return requests


def _default_prompt(kind: Modality, takes: Takes) -> str:
    """The question for a file of ``kind`` given none: its kind's, a video's clips cut as
    single frames being frames."""
    from mmbatch.sources import DEFAULT_PROMPTS

    frames = kind == "video" and takes.clips is not None and takes.clips.frame
    return DEFAULT_PROMPTS["frame" if frames else kind]


def _not_wanted(file: InputFile, kind: Modality, takes: Takes, log: ListingLog) -> ItemError | None:
    """The error row of a file the user named whose kind the job does not take; None for a
    file a folder walk found, which is only counted in ``log``."""
    if file.walked:
        log.skip(
            "videos (caption them whole with --as-clip)"
            if kind == "video" and not takes.whole_videos
            else f"{kind} files (the model takes no {kind})"
        )
        return None
    reason = _not_taken(kind, takes.whole_videos, takes.kinds, takes.by)
    return ItemError("validate", reason, "unsupported")


def _not_taken(kind: Modality, as_clip: bool, take: Collection[Modality], taker: str) -> str:
    """Why a file the user named is not taken: a video that could be, another way, or a
    kind ``taker`` does not take at all."""
    if kind == "video" and not as_clip:
        return "a video: caption it whole with --as-clip, or its frames with `mmbatch frames`"
    takes = " or ".join(sorted(set(take)))
    article = "a" if kind == "video" else "an"
    return f"{article} {kind} file, but {taker} takes {takes} only"


def modality_of(path: str) -> Modality:
    """The modality a file's suffix names (anything unknown is tried as an image)."""
    suffix = Path(path).suffix.lower()
    if suffix in VIDEO_SUFFIXES:
        return "video"
    if suffix in AUDIO_SUFFIXES:
        return "audio"
    return "image"
