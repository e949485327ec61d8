"""Videos cut into clips the way video2dataset's users cut them: clips of N seconds with a
stride, and scenes cut by FFmpeg's scene score, each a row; checked on videos whose cuts and
lengths are known (made with PyAV), through the command with the fake engine. The real
engine's clip path is in ``test_media_end_to_end.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from error_line import one_error
from fake_cli import main
from fake_engine import FakeEngine
from media_files import (
    VFR_PTS_MS,
    cfr_video,
    frame_number,
    native_clock_video,
    scene_video,
    write_video,
)

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK
from mmbatch.media.decode import ClipJob, decode
from mmbatch.media.options import VideoOptions
from mmbatch.media.scenes import scene_cuts
from mmbatch.media.video import index_video, sample_frames
from mmbatch.output.formats import read_output
from mmbatch.sources.clips import ClipSplit, clip_requests, clip_spans, pick_frame
from mmbatch.sources.log import ListingLog
from mmbatch.types import ClipSpan, FrameAt, MediaItem

RED, GREEN, BLUE, YELLOW = (200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40)
SCENES = [(30, RED), (20, GREEN), (40, BLUE), (10, YELLOW)]
"""4 s at 25 fps; scenes change at frames 30, 50 and 90 (1.2, 2.0 and 3.6 s)."""


def spans(path: Path, split: ClipSplit, cuts: tuple[int, ...] = ()) -> list[tuple[object, ...]]:
    index = index_video(str(path))
    return [(s.first, s.stop, s.start, s.end) for s in clip_spans(index, split, cuts)]


def test_scene_changes_are_found_at_the_frames_they_happen(tmp_path: Path) -> None:
    path = scene_video(tmp_path / "scenes.mp4", SCENES)
    index = index_video(str(path))
    assert index.keyframes == (0,)  # no key frame at any cut: found from the pictures
    assert scene_cuts(str(path), index) == [30, 50, 90]  # and not where the square moves
    assert scene_cuts(str(path), index, threshold=1.0) == []  # no score is above 1
    assert spans(path, ClipSplit(scenes=True), (30, 50, 90)) == [
        (0, 30, 0.0, 1.2),
        (30, 50, 1.2, 2.0),
        (50, 90, 2.0, 3.6),
        (90, 100, 3.6, 4.0),
    ]


def test_a_scene_change_soon_after_another_is_ignored(tmp_path: Path) -> None:
    path = scene_video(tmp_path / "flash.mp4", [(30, RED), (5, GREEN), (45, BLUE)])
    index = index_video(str(path))
    assert scene_cuts(str(path), index, min_seconds=0) == [30, 35]
    assert scene_cuts(str(path), index) == [30]  # 0.2 s after the cut: within 0.5 s
    assert scene_cuts(str(path), index, min_seconds=1.3) == [35]  # the first: 1.2 s in
    assert scene_cuts(str(path), index, min_seconds=1.5) == []


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        (
            ClipSplit(seconds=1),
            [(0, 25, 0.0, 1.0), (25, 50, 1.0, 2.0), (50, 75, 2.0, 3.0), (75, 100, 3.0, 4.0)],
        ),
        (  # overlapping: the last clip is the first to reach the end
            ClipSplit(seconds=1.5, stride=1),
            [(0, 38, 0.0, 1.5), (25, 63, 1.0, 2.5), (50, 88, 2.0, 3.5), (75, 100, 3.0, 4.0)],
        ),
        (  # gaps between the clips
            ClipSplit(seconds=1, stride=1.5),
            [(0, 25, 0.0, 1.0), (38, 63, 1.5, 2.5), (75, 100, 3.0, 4.0)],
        ),
        (ClipSplit(seconds=3), [(0, 75, 0.0, 3.0), (75, 100, 3.0, 4.0)]),  # a shorter last
        (ClipSplit(seconds=10), [(0, 100, 0.0, 4.0)]),
    ],
)
def test_clips_of_a_known_length_video_span_the_expected_frames(
    tmp_path: Path, split: ClipSplit, expected: list[tuple[object, ...]]
) -> None:
    # The encoder's clock (1/12800 s at 25 fps): frame 25 is at exactly 1 s only in exact
    # arithmetic on the pts, which is how clips are cut.
    path = native_clock_video(tmp_path / "four.mp4", 100)
    assert spans(path, split) == expected


def test_scenes_longer_than_the_clip_length_are_cut_further(tmp_path: Path) -> None:
    path = native_clock_video(tmp_path / "four.mp4", 100)
    assert spans(path, ClipSplit(seconds=1, scenes=True), (30, 50, 90)) == [
        (0, 25, 0.0, 1.0),
        (25, 30, 1.0, 1.2),
        (30, 50, 1.2, 2.0),
        (50, 75, 2.0, 3.0),
        (75, 90, 3.0, 3.6),
        (90, 100, 3.6, 4.0),
    ]


def test_a_stretch_without_frames_makes_no_clip(tmp_path: Path) -> None:
    # A variable frame rate: nothing between 1.52 s and 3 s.
    path = write_video(tmp_path / "vfr.mp4", VFR_PTS_MS, gop=4)
    got = spans(path, ClipSplit(seconds=0.5))
    assert [(first, stop, start) for first, stop, start, _ in got] == [
        (0, 4, 0.0),
        (4, 5, 0.5),
        (5, 6, 1.0),
        (6, 9, 1.5),
        (9, 10, 3.0),
    ]


def test_a_clip_is_sampled_from_its_own_frames(tmp_path: Path) -> None:
    """The clip handed to the model holds frames of its span only, sampled as a whole
    video of that length would be (frame i is painted a colour that names it)."""
    path = cfr_video(tmp_path / "paint.mp4", frames=100)  # key frames every 12 frames
    index = index_video(str(path))
    span = clip_spans(index, ClipSplit(seconds=1))[1]
    assert (span.first, span.stop) == (25, 50)
    clip = index.between(25, 50)
    for options in (VideoOptions(num_frames=5), VideoOptions(sampling="keyframes")):
        item = decode(ClipJob("k", str(path), index, options, span))["k"]
        assert isinstance(item, MediaItem), item
        frames, metadata = item.payload
        chosen = sample_frames(clip, options).frames
        assert [frame_number(f) for f in frames] == [(25 + i) % 48 for i in chosen]
        assert metadata["frames_indices"] == chosen
        assert (metadata["total_num_frames"], metadata["duration"]) == (25, pytest.approx(1.0))
    assert sample_frames(clip, VideoOptions(sampling="keyframes")).frames == [11, 23]  # 36, 48
    # A clip between two key frames has none to sample: that clip's error, said plainly.
    error = decode(ClipJob("k", str(path), index, VideoOptions(sampling="keyframes"),
                          ClipSpan(25, 35, 1.0, 1.4)))["k"]  # fmt: skip
    assert not isinstance(error, MediaItem)
    assert "no key frame" in error.message


def test_a_clip_as_one_picture_is_its_middle_or_its_nearest_key_frame(tmp_path: Path) -> None:
    path = cfr_video(tmp_path / "paint.mp4", frames=100)  # key frames at 0, 12, 24, 36, ...
    index = index_video(str(path))
    first, second = clip_spans(index, ClipSplit(seconds=1))[:2]
    assert pick_frame(index, first, "middle") == 12  # on screen at 0.5 s
    assert pick_frame(index, second, "middle") == 37  # at 1.5 s
    assert pick_frame(index, second, "keyframe") == 36
    no_key = ClipSpan(25, 35, 1.0, 1.4)
    assert pick_frame(index, no_key, "keyframe") == pick_frame(index, no_key, "middle") == 30
    log = ListingLog()
    requests = clip_requests(
        [str(scene_video(tmp_path / "s.mp4", SCENES))],
        ClipSplit(scenes=True, frame="keyframe"),
        "p",
        log=log,
    )
    # Key frames only at frame 0: the first scene's is taken, the others' middle frames.
    assert [dict(r.columns)["frame_index"] for r in requests] == [0, 40, 70, 95]
    assert [r.media[0].part for r in requests][1] == FrameAt(40, 1.6)
    assert "3 clips hold no key frame: their middle frame is taken" in log.notes


def test_clip_rows_carry_their_span_and_resume_by_id(
    tiny_vl_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    video = str(scene_video(tmp_path / "scenes.mp4", SCENES))
    out = tmp_path / "clips.jsonl"
    argv = ["caption", video, "--scenes", "--num-frames", "4", "--no-progress"]
    argv += ["--model", str(tiny_vl_model), "--out", str(out)]
    assert main(argv, FakeEngine()) == EXIT_OK
    rows = list(read_output(out))
    assert [(r["id"], r["start"], r["end"], r["error"]) for r in rows] == [
        (f"{video}@0.000", 0.0, 1.2, None),
        (f"{video}@1.200", 1.2, 2.0, None),
        (f"{video}@2.000", 2.0, 3.6, None),
        (f"{video}@3.600", 3.6, 4.0, None),
    ]
    assert len({r["media_hash"] for r in rows}) == 4  # four clips, four keys
    assert "1 video cut into 4 clips: 3 scene changes" in capsys.readouterr().err
    # The same command finds the same clips: nothing left to do.
    engine = FakeEngine()
    assert main(argv, engine) == EXIT_OK
    assert "4 items already have a row; 0 items to do" in capsys.readouterr().err
    assert list(read_output(out)) == rows
    # Other cuts are another job: refused, saying what changed.
    assert main([*argv, "--scene-threshold", "0.5"], FakeEngine()) == EXIT_JOB_FAILED
    assert "how videos are cut into clips" in one_error(capsys)


def test_a_video_that_cannot_be_cut_is_one_error_row(tiny_vl_model: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.mp4").write_text("not a video")
    good = cfr_video(tmp_path / "good.mp4", frames=50)
    out = tmp_path / "clips.jsonl"
    argv = ["caption", str(tmp_path / "notes.mp4"), str(good), "--clip-seconds", "1"]
    argv += ["--clip-frame", "middle", "--model", str(tiny_vl_model), "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_ITEMS_FAILED
    rows = {r["id"]: r for r in read_output(out)}
    bad = rows[str(tmp_path / "notes.mp4")]
    assert (bad["error"]["kind"], bad["start"]) == ("not_media", None)
    assert [(r["frame_index"], r["error"]) for k, r in rows.items() if k != bad["id"]] == [
        (12, None),
        (37, None),
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--stride", "2"], "--stride applies to clips: add --clip-seconds N or --scenes"),
        (["--scenes", "--timestamps", "1"], "--timestamps picks frames of a whole video"),
        (["--scenes", "--clip-frame", "middle", "--fps", "1"], "--fps samples a clip's frames"),
        (["--clip-seconds", "0"], "clip seconds must be > 0, got 0.0"),
        (["--scenes", "--scene-threshold", "2"], "scene threshold must be in (0, 1], got 2.0"),
    ],
)
def test_clip_flags_that_cannot_be_are_one_line(
    samples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    out = tmp_path / "out" / "c.jsonl"
    argv = ["caption", str(samples / "clip.mp4"), "--model", "m", "--out", str(out), *flags]
    assert main(argv) == EXIT_JOB_FAILED
    assert message in one_error(capsys)
    assert not out.parent.exists()
