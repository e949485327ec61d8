"""Video frames, clips and audio windows through loader, planner and pipeline (fake engine).

The engine here is the fake one (its text is a function of media keys and prompt), so these
tests check the bookkeeping: one row per frame or window with its columns, each video
decoded once per window, keys that change exactly when the decoded media changes. The real
engine runs the same paths in test_media_end_to_end.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_engine import FakeEngine, expected_text
from media_files import cfr_video, frame_number, write_audio
from media_loader import MediaLoader

import mmbatch.media.video as video_module
from mmbatch.media.options import AudioOptions, MediaOptions, VideoOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.sources.timeline import audio_requests, frame_requests
from mmbatch.types import MediaRef, Request, Sampling


def run(requests: list[Request], options: MediaOptions | None = None) -> tuple[list[dict], Any]:  # type: ignore[type-arg]
    """Through the streaming pipeline and the fake engine: the rows and the stats."""
    sink = MemorySink()
    run = RunConfig(progress=False, decode_workers=0)  # decoded here, where the spy sees it
    stats = run_requests(requests, FakeEngine(), options or MediaOptions(), sink, Sampling(), run)
    return sink.rows, stats


@pytest.fixture
def decode_passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The videos ``decode_frames`` was called on, in order (the real function still runs)."""
    calls: list[str] = []
    real = video_module.decode_frames

    def spy(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(video_module, "decode_frames", spy)
    return calls


def test_frames_job_one_row_per_frame_each_video_decoded_once(
    tmp_path: Path, decode_passes: list[str]
) -> None:
    a = cfr_video(tmp_path / "a.mp4", frames=50)
    b = cfr_video(tmp_path / "b.mp4", frames=30)
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00" * 100)
    options = VideoOptions(sampling="fps", fps=5)
    requests = frame_requests([str(a), str(broken), str(b)], options, "What is this?")
    rows, stats = run(requests, MediaOptions(video=options))
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in requests)
    ok = [r for r in rows if r["error"] is None]
    assert len(ok) == 10 + 6
    for row in ok:
        assert row["text"] == expected_text([row["media_hash"]], "What is this?")
        assert row["id"] == f"{row['video']}@{row['pts']:.3f}"
        assert row["pts"] == pytest.approx(row["frame_index"] * 0.04)
    assert len({r["media_hash"] for r in ok}) == 16
    [failed] = [r for r in rows if r["error"]]
    assert failed["id"] == str(broken)
    assert failed["error"]["stage"] == "decode"
    assert "not a media file" in failed["error"]["message"]
    # One decoding pass per video for all of its frames, not one per frame.
    assert sorted(decode_passes) == ["a.mp4", "b.mp4"]
    assert stats.decodes == 16


def test_decoded_frames_are_the_frames_the_rows_name(tmp_path: Path) -> None:
    path = cfr_video(tmp_path / "a.mp4", frames=50)
    options = VideoOptions(sampling="num_frames", num_frames=5)
    requests = frame_requests([str(path)], options, "p")
    loader = MediaLoader(MediaOptions(video=options))
    window = loader.load(requests)
    for loaded in window.requests:
        image = window.media[loaded.media_keys[0]].payload
        assert frame_number(np.asarray(image)) == dict(loaded.request.columns)["frame_index"]


def test_frame_keys_follow_the_frame_not_the_sampling(samples: Path) -> None:
    clip = str(samples / "clip.mp4")

    def keys(options: VideoOptions) -> dict[int, str]:
        window = MediaLoader(MediaOptions(video=options)).load(frame_requests([clip], options, "p"))
        return {dict(r.request.columns)["frame_index"]: r.media_keys[0] for r in window.requests}

    by_fps = keys(VideoOptions(sampling="fps", fps=25))
    by_keyframes = keys(VideoOptions(sampling="keyframes"))
    assert by_fps[0] == by_keyframes[0]  # frame 0 either way: one item, cached once
    assert by_fps[0] != by_fps[25]
    smaller = keys(VideoOptions(sampling="fps", fps=25, max_pixels=1000))
    assert smaller[0] != by_fps[0]  # other pixels, other key


def test_save_frames_writes_jpegs_named_by_video_and_pts(samples: Path, tmp_path: Path) -> None:
    options = VideoOptions(sampling="fps", fps=1)
    requests = frame_requests([str(samples / "clip.mp4")], options, "p")
    run(requests, MediaOptions(video=options, frame_dir=str(tmp_path / "frames")))
    names = sorted(p.name for p in (tmp_path / "frames").iterdir())
    flat = str(samples / "clip.mp4").lstrip("/").replace("/", "_")
    assert names == [f"{flat}@0.480.jpg", f"{flat}@1.480.jpg"]  # as FFmpeg's fps=1 picks


def test_clip_is_one_video_item_keyed_by_its_sampling(samples: Path) -> None:
    request = Request("c", "p", (MediaRef("video", str(samples / "clip.mp4")),))
    eight = MediaLoader(MediaOptions(video=VideoOptions(num_frames=8))).load([request])
    four = MediaLoader(MediaOptions(video=VideoOptions(num_frames=4))).load([request])
    (key8,), (key4,) = eight.requests[0].media_keys, four.requests[0].media_keys
    assert key8 != key4
    frames, meta = eight.media[key8].payload
    assert frames.shape == (8, 64, 96, 3)
    assert meta["frames_indices"] == [3, 9, 15, 21, 28, 34, 40, 46]
    assert eight.media[key8].meta["frames"] == 8


def test_audio_windows_through_the_pipeline(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "talk.wav", rate=8000, seconds=2.5)
    options = AudioOptions(window_s=1.0, overlap_s=0.25)
    requests = audio_requests([str(path)], options, "Transcribe.")
    loader = MediaLoader(MediaOptions(audio=options))
    window = loader.load(requests)
    payloads = [window.media[r.media_keys[0]].payload for r in window.requests]
    assert [(s.dtype, s.size, rate) for s, rate in payloads] == [(np.float32, 16000, 16000)] * 3
    rows = sorted(run(requests, loader.options)[0], key=lambda r: r["start"])  # finished backwards
    assert [(r["start"], r["end"], r["error"]) for r in rows] == [
        (0.0, 1.0, None),
        (0.75, 1.75, None),
        (1.5, 2.5, None),
    ]
    assert len({r["media_hash"] for r in rows}) == 3


def test_an_unreadable_part_is_an_error_row_with_its_stage(samples: Path) -> None:
    from mmbatch.sources.mixed_media import Takes, list_media, media_requests

    requests = media_requests(list_media([str(samples / "tone.wav")]), "p", takes=Takes(("image",)))
    [row], _ = run(requests)
    assert row["error"] == {
        "stage": "validate",
        "kind": "unsupported",
        "message": "an audio file, but the model takes image only",
    }


def test_rows_are_json(tmp_path: Path, samples: Path) -> None:
    requests = frame_requests([str(samples / "clip.mp4")], VideoOptions(num_frames=2), "p")
    rows, _ = run(requests)
    assert json.loads(json.dumps(rows)) == rows


def test_a_video_cut_off_mid_stream_gives_the_frames_it_still_holds(tmp_path: Path) -> None:
    import av
    from media_files import truncated

    # moov first (as streaming muxers write it), so the index survives the cut.
    whole = tmp_path / "whole.mp4"
    cfr_video(whole, frames=50, size=(64, 48))
    fast = tmp_path / "fast.mp4"
    with (
        av.open(str(whole)) as src,
        av.open(str(fast), "w", options={"movflags": "faststart"}) as dst,
    ):
        stream = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                dst.mux(packet)
    cut = truncated(fast, tmp_path / "cut.mp4", keep=0.6)
    # The index holds the frames whose packets survived; sampling spreads over those, and
    # each sampled frame is the frame it names.
    index = video_module.index_video(str(cut))
    assert 0 < len(index.pts) < 50
    options = VideoOptions(sampling="num_frames", num_frames=4)
    requests = frame_requests([str(cut)], options, "p")
    loader = MediaLoader(MediaOptions(video=options))
    window = loader.load(requests)
    assert not window.failures
    for loaded in window.requests:
        image = np.asarray(window.media[loaded.media_keys[0]].payload)
        assert frame_number(image) == dict(loaded.request.columns)["frame_index"]
        assert dict(loaded.request.columns)["pts"] < index.end


def test_gallery_previews_a_frame_row_with_its_frame(samples: Path) -> None:
    import base64
    import io

    from PIL import Image

    from mmbatch.review.thumbnails import NoPreview, thumbnail_uri
    from mmbatch.types import FrameAt

    clip = str(samples / "clip.mp4")
    uri = thumbnail_uri(MediaRef("image", clip, part=FrameAt(25, 1.0)))
    data = base64.b64decode(uri.split(",", 1)[1])
    with Image.open(io.BytesIO(data)) as thumb:
        assert frame_number(np.asarray(thumb.convert("RGB"))) == 25
    with pytest.raises(NoPreview, match=r"no frame 25 at 1\.500"):
        thumbnail_uri(MediaRef("image", clip, part=FrameAt(25, 1.5)))
    with pytest.raises(NoPreview, match="audio has no picture"):
        thumbnail_uri(MediaRef("audio", str(samples / "tone.wav")))
