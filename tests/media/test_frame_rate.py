"""``--fps`` samples as FFmpeg's ``fps`` filter does (the filter video2dataset uses), each
frame once: checked against that filter itself, run by PyAV on the same files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from media_files import VFR_PTS_MS, cfr_video, fps_filter_pts, native_clock_video, write_video

from mmbatch.media.options import VideoOptions
from mmbatch.media.video import index_video, sample_frames
from mmbatch.sources.log import ListingLog
from mmbatch.sources.timeline import frame_requests

FILES: dict[str, Callable[[Path], Path]] = {
    # The encoder's clock, FFmpeg's default: 1/12800 s in an mp4 at 25 fps, where frames
    # 29, 59 and 119 fell a float's hair past the sample times and were lost.
    "25 fps, 1/12800 s clock": lambda d: native_clock_video(d / "native.mp4", 125),
    "25 fps, 1/16000 s clock": lambda d: cfr_video(d / "ms.mp4", frames=125),
    "30 fps, mkv's 1 ms clock": lambda d: native_clock_video(d / "thirty.mkv", 75, fps=30),
    "variable rate": lambda d: write_video(d / "vfr.mp4", VFR_PTS_MS, gop=4),
    "2.5 s at 10 fps": lambda d: cfr_video(d / "short.mp4", frames=25, fps=10),
}
RATES = (25, 12.5, 50, 30, 60, 10, 5, 2, 1, 0.5, 0.3, 29.97)
"""Native rates of the files, half and double them, and rates that fit no file's grid."""


@pytest.mark.parametrize("name", FILES)
def test_fps_takes_the_frames_the_fps_filter_outputs_each_once(name: str, tmp_path: Path) -> None:
    path = FILES[name](tmp_path)
    index = index_video(str(path))
    for fps in RATES:
        shown = fps_filter_pts(path, fps)
        # The filter shows frames in order, repeating one over the slots it covers: its
        # distinct frames, ascending, are the frames a frame job takes.
        assert shown == sorted(shown)
        sample = sample_frames(index, VideoOptions(sampling="fps", fps=fps))
        assert [index.pts[i] for i in sample.frames] == sorted(set(shown)), fps
        assert sample.asked == len(shown), fps


def test_a_length_that_is_not_a_whole_number_of_steps_keeps_its_last_step(
    tmp_path: Path,
) -> None:
    path = cfr_video(tmp_path / "short.mp4", frames=25, fps=10)  # 2.5 s
    requests = frame_requests([str(path)], VideoOptions(sampling="fps", fps=1), "p")
    # Slots at 0, 1 and 2 s; each shows the last frame whose time rounds to it: the frame on
    # screen just before the half second.
    assert [dict(r.columns)["pts"] for r in requests] == [0.4, 1.4, 2.4]
    index = index_video(str(path))
    assert fps_filter_pts(path, 1) == [index.pts[i] for i in (4, 14, 24)]


def test_a_rate_above_the_videos_takes_each_frame_once_and_says_so(tmp_path: Path) -> None:
    path = write_video(tmp_path / "vfr.mp4", VFR_PTS_MS, gop=4)
    log = ListingLog()
    requests = frame_requests([str(path)], VideoOptions(sampling="fps", fps=20), "p", log=log)
    indices = [dict(r.columns)["frame_index"] for r in requests]
    assert indices == sorted(set(indices))
    assert len(fps_filter_pts(path, 20)) == 61  # 3.04 s of slots: frames shown again
    assert log.notes == [
        f"{path}: 61 frames asked for fall on {len(indices)} distinct frames, each taken once"
    ]


def test_a_video_shorter_than_half_a_step_still_gives_a_frame(tmp_path: Path) -> None:
    """The one departure from the filter, which outputs nothing for it: a video's row
    would vanish without a word."""
    path = cfr_video(tmp_path / "blink.mp4", frames=4)  # 0.16 s
    assert fps_filter_pts(path, 1) == []
    sample = sample_frames(index_video(str(path)), VideoOptions(sampling="fps", fps=1))
    assert (sample.frames, sample.asked) == ([3], 1)  # the one slot's frame, as the filter's
