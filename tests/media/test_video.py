"""The PyAV video loader on files whose every frame is known (see media_files.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from media_files import VFR_PTS_MS, cfr_video, frame_number, truncated, write_audio, write_video

from mmbatch.errors import ConfigError, MediaError
from mmbatch.media.container import open_media, set_decoder_threads, threaded
from mmbatch.media.decoders import decode_pool
from mmbatch.media.options import VideoOptions
from mmbatch.media.video import clip_from, decode_frames, index_video, select_frames


@pytest.fixture(scope="module")
def cfr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 s at 25 fps: frame i from i * 40 ms; key frames every 12 frames."""
    return cfr_video(tmp_path_factory.mktemp("v") / "cfr.mp4", frames=50, gop=12)


def sample_clip(path: str, options: VideoOptions) -> tuple[np.ndarray, dict[str, Any]]:
    """The clip ``options`` samples from the video at ``path``, as the loader decodes it."""
    index = index_video(path)
    return clip_from(path, index, select_frames(index, options), options.max_pixels)


def sample(path: Path, options: VideoOptions) -> list[tuple[int, float, int]]:
    """(index, pts, the frame number read back from its colour) of each sampled frame."""
    index = index_video(str(path))
    chosen = select_frames(index, options)
    frames = decode_frames(str(path), index, chosen).frames
    return [(i, index.seconds(i), frame_number(frames[i])) for i in chosen]


def test_the_frame_taken_at_t_is_the_frame_shown_at_t(cfr: Path) -> None:
    times = (0.0, 0.5, 0.519, 1.01, 1.99)
    got = sample(cfr, VideoOptions(sampling="timestamps", timestamps=times))
    # Frame i is on screen from i * 40 ms to (i + 1) * 40 ms.
    expected = sorted({int(t * 1000) // 40 for t in times})
    assert [i for i, _, _ in got] == expected
    for i, pts, painted in got:
        assert painted == i % 48
        assert pts == pytest.approx(i * 0.040)


def test_num_frames_spreads_evenly_and_each_frame_is_the_right_one(cfr: Path) -> None:
    got = sample(cfr, VideoOptions(sampling="num_frames", num_frames=8))
    # The middles of 8 slices of 2 s: 0.125 s, 0.375 s, ... -> frames 3, 9, 15, ...
    assert [i for i, _, _ in got] == [int((k + 0.5) * 2000 / 8) // 40 for k in range(8)]
    assert all(painted == i % 48 for i, _, painted in got)


def test_fps_sampling_and_the_max_frames_cap(cfr: Path) -> None:
    got = sample(cfr, VideoOptions(sampling="fps", fps=5))
    # FFmpeg's fps filter: slot k shows the last frame whose time rounds to k / 5 s, the
    # frame on screen just before (k + 0.5) / 5 s (test_frame_rate.py holds it to the filter).
    assert [i for i, _, _ in got] == list(range(2, 50, 5))
    assert all(painted == i % 48 for i, _, painted in got)
    capped = sample(cfr, VideoOptions(sampling="fps", fps=25, max_frames=4))
    assert [i for i, _, _ in capped] == [0, 16, 33, 49]  # spread over all 50, ends kept
    assert all(painted == i % 48 for i, _, painted in capped)


def test_keyframes_are_the_coded_key_frames(cfr: Path) -> None:
    index = index_video(str(cfr))
    assert index.keyframes == (0, 12, 24, 36, 48)
    got = sample(cfr, VideoOptions(sampling="keyframes"))
    assert [(i, painted) for i, _, painted in got] == [(k, k % 48) for k in index.keyframes]


def test_sparse_frames_are_reached_by_seeking_not_by_decoding_everything(
    tmp_path: Path,
) -> None:
    path = cfr_video(tmp_path / "long.mp4", frames=240, gop=24)
    index = index_video(str(path))
    wanted = [30, 130, 230]
    result = decode_frames(str(path), index, wanted)
    assert sorted(result.frames) == wanted
    assert [frame_number(result.frames[i]) for i in wanted] == [i % 48 for i in wanted]
    # Each wanted frame costs at most its GOP (24 frames), never the 240 of the whole video.
    assert result.seeks >= 3
    assert result.decoded <= 3 * 24 + 8
    everything = decode_frames(str(path), index, range(240))
    assert everything.decoded >= 240


def test_a_decode_pools_workers_decode_on_one_ffmpeg_thread_each(cfr: Path) -> None:
    """The pool's processes are the parallelism: FFmpeg's thread per core in each of them
    would take the cores from vLLM's engine loop. A lone decoder keeps FFmpeg's count."""
    in_worker = decode_pool(2).submit(threaded, SimpleNamespace()).result(timeout=120)
    assert (in_worker.thread_type, in_worker.thread_count) == ("AUTO", 1)
    assert not hasattr(threaded(SimpleNamespace()), "thread_count")  # FFmpeg's own count here
    index = index_video(str(cfr))
    wanted = [0, 13, 26, 49]
    lone = decode_frames(str(cfr), index, wanted).frames
    set_decoder_threads(1)
    try:
        with open_media(str(cfr)) as container:
            assert threaded(container.streams.video[0]).thread_count == 1
        one = decode_frames(str(cfr), index, wanted).frames
    finally:
        set_decoder_threads(0)
    assert [frame_number(one[i]) for i in wanted] == [i % 48 for i in wanted]
    assert all(np.array_equal(one[i], lone[i]) for i in wanted)


def test_variable_frame_rate(tmp_path: Path) -> None:
    path = write_video(tmp_path / "vfr.mp4", VFR_PTS_MS, gop=4)
    index = index_video(str(path))
    assert [round(index.seconds(i) * 1000) for i in range(len(index.pts))] == list(VFR_PTS_MS)
    times = (0.005, 0.215, 0.95, 1.4, 1.515, 2.9)
    got = sample(path, VideoOptions(sampling="timestamps", timestamps=times))
    # The frame on screen at t is the last one whose pts <= t.
    assert [i for i, _, _ in got] == [0, 2, 4, 5, 7, 8]
    assert all(painted == i for i, _, painted in got)
    assert [round(pts * 1000) for _, pts, _ in got] == [0, 200, 900, 1000, 1510, 1520]
    # At 2 fps over a frame that stays 1.48 s, that frame is taken once, not three times.
    fps = [i for i, _, _ in sample(path, VideoOptions(sampling="fps", fps=2))]
    assert fps == sorted(set(fps))
    # FFmpeg's fps filter rounds each frame's time to the nearest slot and shows in each slot
    # the last frame rounded to it or before: slots 0 and 0.5 s show frame 3 (230 ms), 1 s
    # frame 5 (1 s), 1.5 to 2.5 s frame 8 (1.52 s). The grid ends before the slot of 3.04 s,
    # where the last frame stops showing: the last frame, rounded to that slot, is not shown.
    assert fps == [3, 5, 8]


def test_rotation_metadata_turns_frames_upright(tmp_path: Path) -> None:
    path = cfr_video(tmp_path / "rot.mp4", frames=4, size=(64, 48), rotation=90, marker=True)
    index = index_video(str(path))
    assert index.rotation == 90
    assert index.display_size == (48, 64)
    frames, _ = sample_clip(str(path), VideoOptions(num_frames=2))
    assert frames.shape[1:] == (64, 48, 3)  # portrait now
    # A 90 degree counter-clockwise turn moves the top-left corner to the bottom-left.
    corner = frames[0]
    assert corner[-4:, :4].mean() > 230
    assert corner[:4, :4].mean() < 200


@pytest.mark.parametrize("count", [1, 3])
def test_very_short_clips_give_each_frame_once(tmp_path: Path, count: int) -> None:
    path = cfr_video(tmp_path / "short.mp4", frames=count)
    frames, meta = sample_clip(str(path), VideoOptions(num_frames=8))
    assert frames.shape[0] == count
    assert meta["frames_indices"] == list(range(count))
    assert [frame_number(f) for f in frames] == list(range(count))


def test_clip_is_the_frames_and_metadata_vllm_takes(cfr: Path) -> None:
    frames, meta = sample_clip(str(cfr), VideoOptions(num_frames=4, max_pixels=32 * 24))
    assert frames.dtype == np.uint8
    assert frames.shape == (4, 24, 32, 3)
    assert meta == {
        "total_num_frames": 50,
        "fps": pytest.approx(25.0),
        "duration": pytest.approx(2.0),
        "frames_indices": [6, 18, 31, 43],
        "video_backend": "opencv",
        "do_sample_frames": False,
    }


def test_a_file_without_video_says_so(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "speech.wav")
    with pytest.raises(MediaError, match=r"no video stream \(streams: audio\)"):
        index_video(str(path))


def test_a_truncated_mp4_is_a_clear_error(cfr: Path, tmp_path: Path) -> None:
    path = truncated(cfr, tmp_path / "cut.mp4")
    with pytest.raises(MediaError, match="not a media file PyAV can open") as info:
        index_video(str(path))
    assert info.value.stage == "decode"


def test_missing_file_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="does not exist") as info:
        index_video(str(tmp_path / "nope.mp4"))
    assert info.value.stage == "load"


def test_a_timestamp_past_the_end_is_an_error(cfr: Path) -> None:
    index = index_video(str(cfr))
    with pytest.raises(MediaError, match="past the end"):
        select_frames(index, VideoOptions(sampling="timestamps", timestamps=(1.0, 9.0)))


def test_options_are_validated_and_keyed_on_what_matters() -> None:
    with pytest.raises(ConfigError, match="num_frames"):
        VideoOptions(num_frames=0)
    with pytest.raises(ConfigError, match="timestamp"):
        VideoOptions(sampling="timestamps")
    assert VideoOptions(num_frames=8).cache_token() != VideoOptions(num_frames=4).cache_token()
    assert VideoOptions(max_pixels=100).cache_token() != VideoOptions().cache_token()
    # The fps of a num_frames sampling does not change the frames, so not the key either.
    assert VideoOptions(fps=3).cache_token() == VideoOptions(fps=1).cache_token()


def test_frames_over_the_pixel_cap_are_refused_before_any_decoding(
    cfr: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmbatch.media import video

    assert VideoOptions().max_source_pixels == 64_000_000  # as for images
    with pytest.raises(ConfigError, match="max_source_pixels"):
        VideoOptions(max_source_pixels=0)

    def no_decoding(*args: object) -> int:
        raise AssertionError("a frame was decoded")

    monkeypatch.setattr(video, "_first_frame_rotation", no_decoding)
    with pytest.raises(MediaError, match=r"64x48 = 3072 pixels, over the cap of 3071") as info:
        index_video(str(cfr), max_source_pixels=64 * 48 - 1)
    assert (info.value.stage, info.value.kind) == ("decode", "too_large")


def test_the_video_pixel_cap_holds_for_frame_jobs_and_clips(cfr: Path, tmp_path: Path) -> None:
    import json

    from fake_cli import main
    from fake_engine import FakeEngine
    from media_loader import MediaLoader

    from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_OK
    from mmbatch.media.options import MediaOptions
    from mmbatch.types import MediaRef, Request

    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(cfr), "--fps", "1", "--model", "fake", "--no-progress"]
    assert main([*argv, "--out", str(out), "--max-source-pixels", "3071"]) == EXIT_ITEMS_FAILED
    [row] = map(json.loads, out.read_text().splitlines())
    assert row["error"]["kind"] == "too_large"
    assert main([*argv, "--out", str(tmp_path / "ok.jsonl")], FakeEngine()) == EXIT_OK
    clip = Request("c", "Describe.", (MediaRef("video", str(cfr)),))
    capped = MediaLoader(MediaOptions(video=VideoOptions(max_source_pixels=3071)))
    [failure] = capped.load([clip]).failures
    assert failure.error is not None
    assert failure.error.kind == "too_large"
    assert MediaLoader().load([clip]).failures == []


def test_a_truncated_video_whose_index_comes_first_is_flagged(tmp_path: Path) -> None:
    import json

    from fake_cli import main
    from media_loader import MediaLoader

    from mmbatch.cli import EXIT_OK
    from mmbatch.types import MediaRef, Request

    whole = cfr_video(tmp_path / "whole.mp4", frames=125, faststart=True)
    cut = truncated(whole, tmp_path / "cut.mp4")
    assert index_video(str(whole)).truncation is None
    index = index_video(str(cut))  # it opens and demuxes: as a shorter video
    assert 0 < len(index.pts) < 125
    assert index.truncation == (
        f"truncated video: its header declares 125 frames; the file holds {len(index.pts)} "
        f"frames ({index.end:.3f} s)"
    )
    # Frame rows carry the flag; the frames they show are still the right ones.
    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(whole), str(cut), "--num-frames", "4", "--model", "fake"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == EXIT_OK  # flagged, not failed
    rows = list(map(json.loads, out.read_text().splitlines()))
    flagged = [r for r in rows if r["video"] == str(cut)]
    assert len(flagged) == 4
    assert all(r["warning"] == index.truncation for r in flagged)
    assert all("warning" not in r for r in rows if r["video"] == str(whole))
    # A clip of it would pass the part left off as the whole video: an error row.
    clip = Request("c", "Describe.", (MediaRef("video", str(cut)),))
    [failure] = MediaLoader().load([clip]).failures
    assert failure.error is not None
    assert failure.error.message.startswith("truncated video: its header declares 125")


@pytest.mark.parametrize(
    "make",
    [
        lambda d: cfr_video(d / "cfr.mp4", frames=50),
        lambda d: write_video(d / "vfr.mp4", VFR_PTS_MS),
        lambda d: write_video(d / "one.mp4", [0]),
        lambda d: write_video(d / "rotated.mp4", [i * 40 for i in range(9)], rotation=90),
        lambda d: write_video(d / "v.mkv", [i * 40 for i in range(30)]),
        lambda d: write_video(d / "v.webm", [i * 40 for i in range(30)], codec="libvpx-vp9"),
    ],
)
def test_whole_videos_are_not_flagged(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    assert index_video(str(make(tmp_path))).truncation is None


def test_a_truncated_webm_is_flagged_by_its_declared_duration(tmp_path: Path) -> None:
    whole = write_video(tmp_path / "v.webm", [i * 40 for i in range(30)], codec="libvpx-vp9")
    index = index_video(str(truncated(whole, tmp_path / "cut.webm")))
    assert index.truncation is not None
    assert "its header declares 1.200 s" in index.truncation
