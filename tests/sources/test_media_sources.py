"""Requests from videos and audio: ids, row columns, and files that cannot be expanded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from media_files import write_audio

from mmbatch.errors import SourceError
from mmbatch.jobs import media_per_prompt
from mmbatch.media.options import AudioOptions, VideoOptions
from mmbatch.sources.mixed_media import Takes, list_media, media_requests
from mmbatch.sources.timeline import audio_requests, frame_requests
from mmbatch.types import FrameAt, ItemError, MediaRef, Request, TimeSpan


def test_one_request_per_sampled_frame_with_video_index_and_pts(samples: Path) -> None:
    clip = str(samples / "clip.mp4")  # 2 s at 25 fps
    requests = frame_requests([clip], VideoOptions(sampling="fps", fps=2), "What is here?")
    # Slots at 0, 0.5, 1 and 1.5 s, as FFmpeg's fps filter fills them: each takes the last
    # frame whose time rounds to it, the one on screen just before half a step past it.
    assert [r.id for r in requests] == [f"{clip}@{t:.3f}" for t in (0.24, 0.72, 1.24, 1.72)]
    assert dict(requests[1].columns) == {"video": clip, "frame_index": 18, "pts": 0.72}
    assert requests[1].media == (MediaRef("image", clip, part=FrameAt(18, 0.72)),)


def test_a_video_that_cannot_be_indexed_is_one_request_that_will_fail(
    samples: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_text("not a video")
    requests = frame_requests([str(bad), str(samples / "clip.mp4")], VideoOptions(), "p")
    assert requests[0].id == str(bad)
    error = requests[0].error
    assert error is not None
    assert "not a media file" in error.message
    assert dict(requests[0].columns) == {"video": str(bad), "frame_index": None, "pts": None}
    assert len(requests) == 1 + 8


def test_audio_windows_are_requests_with_start_and_end(tmp_path: Path) -> None:
    path = str(write_audio(tmp_path / "talk.wav", rate=8000, seconds=2.5))
    requests = audio_requests([path], AudioOptions(window_s=1.0, overlap_s=0.25), "Transcribe.")
    assert [r.id for r in requests] == [f"{path}@0.000", f"{path}@0.750", f"{path}@1.500"]
    (short,) = audio_requests([path], AudioOptions(window_s=5.0), "Transcribe.")
    assert short.id == path  # one window: the file's own id
    assert [dict(r.columns) for r in requests] == [
        {"start": 0.0, "end": 1.0},
        {"start": 0.75, "end": 1.75},
        {"start": 1.5, "end": 2.5},
    ]
    assert requests[2].media == (MediaRef("audio", path, part=TimeSpan(1.5, 2.5)),)


def test_caption_walks_folders_for_what_the_model_takes(samples: Path, tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    shutil.copytree(samples, folder)
    vl = media_requests(list_media([str(folder)]), "p", takes=Takes(("image", "video")))
    assert {r.media[0].modality for r in vl} == {"image"}  # no --as-clip: videos skipped
    clips = media_requests(
        list_media([str(folder)]), "p", takes=Takes(("image", "video"), as_clip=True)
    )
    assert sorted(r.media[0].modality for r in clips).count("video") == 1
    audio = media_requests(list_media([str(folder)]), "p", takes=Takes(("audio",)))
    assert [(r.id, r.media[0].modality) for r in audio] == [(str(folder / "tone.wav"), "audio")]


def test_a_named_file_the_model_cannot_take_gets_an_error_row(samples: Path) -> None:
    wav, mp4 = str(samples / "tone.wav"), str(samples / "clip.mp4")
    requests = media_requests(list_media([wav, mp4]), "p", takes=Takes(("image", "video")))
    reasons = {r.id: r.error for r in requests}
    assert reasons[wav] == ItemError(
        "validate", "an audio file, but the model takes image or video only", "unsupported"
    )
    assert reasons[mp4] is not None
    assert "--as-clip" in reasons[mp4].message


def test_a_folder_with_nothing_the_model_takes_is_a_source_error(
    samples: Path, tmp_path: Path
) -> None:
    shutil.copy(samples / "sunset.jpg", tmp_path / "sunset.jpg")
    with pytest.raises(SourceError, match="no audio the model takes"):
        media_requests(list_media([str(tmp_path)]), "p", takes=Takes(("audio",)))


def test_media_per_prompt_is_the_most_any_request_carries() -> None:
    a = MediaRef("image", "a.jpg")
    requests = [
        Request("1", "p", (a, a)),
        Request("2", "p", (MediaRef("audio", "x.wav"),)),
        Request("3", "p", (a,)),
    ]
    assert media_per_prompt(requests) == {"image": 2, "audio": 1}


def test_frames_closer_than_a_millisecond_keep_unique_ids() -> None:
    from mmbatch.sources.timeline import _unique_frame_ids, frame_id

    def frame(index: int, pts: float) -> Request:
        ref = MediaRef("image", "a#b.mp4", part=FrameAt(index, pts))
        return Request(frame_id("a#b.mp4", pts), "p", (ref,))

    ids = [r.id for r in _unique_frame_ids([frame(0, 0.0), frame(1, 1.0001), frame(2, 1.0004)])]
    assert ids == ["a#b.mp4@0.000", "a#b.mp4@1.000#1", "a#b.mp4@1.000#2"]


def test_unreadable_media_are_not_counted_for_the_engine(samples: Path) -> None:
    files = list_media([str(samples / "tone.wav"), str(samples / "sunset.jpg")])
    requests = media_requests(files, "p", takes=Takes(("image",)))
    assert media_per_prompt(requests) == {"image": 1}
