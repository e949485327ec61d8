"""Nothing listing does goes unsaid: a folder walk takes every picture format the decoder
opens and counts each file it passes over by reason; a frame job takes every frame asked for,
each once, and asks that fall on fewer frames, or a cap that cuts frames (or a clip's cap
that may), say so in the summary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from media_files import cfr_video, native_clock_video, truncated
from PIL import Image

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_OK
from mmbatch.errors import MediaError
from mmbatch.media.image import decode_image, pillow_formats
from mmbatch.media.options import ImageOptions, VideoOptions
from mmbatch.sources.files import image_requests
from mmbatch.sources.log import ListingLog
from mmbatch.sources.timeline import clip_cap_note, frame_requests

EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"


def summary_of(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(out.with_name(out.name + ".summary.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def mixed(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "thumb.jpg").write_bytes(b"x")
    Image.new("RGB", (40, 30), (200, 10, 10)).save(folder / "a.avif")
    (folder / "b.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    (folder / "sub" / "c.png").write_bytes((samples / "checkerboard.png").read_bytes())
    (folder / "d.heic").write_bytes(b"\0\0\0\x18ftypheic")
    (folder / "e.eps").write_bytes(EPS)
    (folder / "notes.txt").write_text("not media")
    (folder / "README").write_text("not media")
    (folder / ".hidden.jpg").write_bytes(b"x")
    (folder / "linked").symlink_to(folder / "sub", target_is_directory=True)
    return folder


def test_a_walk_takes_what_pillow_opens_and_counts_what_it_passes_over(mixed: Path) -> None:
    assert "AVIF" in pillow_formats()  # built into this Pillow
    log = ListingLog()
    requests = image_requests([str(mixed)], "Describe.", log=log)
    assert [Path(r.id).relative_to(mixed).as_posix() for r in requests] == [
        "a.avif",
        "b.jpg",
        "sub/c.png",
    ]
    assert dict(log.skipped) == {
        ".heic files (no decoder here: pip install pillow-heif)": 1,
        ".eps files (PostScript is not rendered)": 1,
        ".txt files": 1,
        "files without a suffix": 1,
        "hidden files": 1,
        "hidden folders (not walked)": 1,
        "linked folders (not followed)": 1,
    }


def test_a_pattern_counts_what_it_matches_and_does_not_take(mixed: Path) -> None:
    log = ListingLog()
    requests = image_requests([str(mixed / "*")], "Describe.", log=log)
    assert [Path(r.id).name for r in requests] == ["a.avif", "b.jpg"]
    assert log.skipped["folders matched by a pattern (not walked)"] == 2  # sub, linked
    assert log.skipped[".txt files"] == 1


def test_the_summary_says_what_the_walk_passed_over(
    mixed: Path, tmp_path: Path, samples: Path, tiny_vl_model: Path
) -> None:
    (mixed / "clip.mp4").write_bytes((samples / "clip.mp4").read_bytes())
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(mixed), "--model", str(tiny_vl_model), "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(Path(r["id"]).name for r in rows) == ["a.avif", "b.jpg", "c.png"]
    skipped = summary_of(out)["job"]["skipped"]
    assert skipped["videos (caption them whole with --as-clip)"] == 1
    assert skipped[".heic files (no decoder here: pip install pillow-heif)"] == 1
    assert sum(skipped.values()) == 8


def test_postscript_is_never_handed_to_ghostscript(tmp_path: Path) -> None:
    with pytest.raises(MediaError) as info:
        decode_image(EPS, ImageOptions())
    assert info.value.kind == "not_media"
    assert "EPS" not in pillow_formats()


@pytest.fixture(scope="module")
def five_seconds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """125 frames at 25 fps on FFmpeg's default clock (1/12800 s in an mp4), where sampling
    by float seconds lost frames 29, 59 and 119."""
    return native_clock_video(tmp_path_factory.mktemp("v") / "five.mp4", frames=125, fps=25)


@pytest.mark.parametrize(
    ("fps", "frames", "asked"),
    [("25", range(125), 125), ("12.5", range(0, 125, 2), 63), ("50", range(125), 250)],
)
def test_a_frame_job_takes_every_frame_asked_for_each_once(
    five_seconds: Path, tmp_path: Path, fps: str, frames: range, asked: int
) -> None:
    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(five_seconds), "--fps", fps, "--model", "fake", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == EXIT_OK
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame_index"] for r in rows] == list(frames)
    # Above the video's own rate, its frames are fewer than the asks: each is taken once.
    fewer = f"{five_seconds}: {asked} frames asked for fall on 125 distinct frames, each taken once"
    assert summary_of(out)["job"]["notes"] == ([fewer] if asked > len(frames) else [])


def test_a_cap_that_cuts_frames_says_so(
    five_seconds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(five_seconds), "--fps", "25", "--model", "fake", "--no-progress"]
    assert main([*argv, "--max-frames", "64", "--out", str(out)]) == EXIT_OK
    assert len(out.read_text().splitlines()) == 64
    note = f"{five_seconds}: 125 frames sampled, 64 taken (spread evenly) by max_frames 64"
    assert summary_of(out)["job"]["notes"] == [note]
    assert f"note: {note}" in capsys.readouterr().err


def test_a_truncated_video_is_noted_in_the_summary(tmp_path: Path) -> None:
    whole = cfr_video(tmp_path / "fast.mp4", frames=125, faststart=True)
    cut = truncated(whole, tmp_path / "c.mp4")
    log = ListingLog()
    requests = frame_requests([str(cut)], VideoOptions(num_frames=2), "Describe.", log=log)
    assert len(requests) == 2
    [note] = log.notes
    assert note.startswith(f"{cut}: truncated video: its header declares 125 frames")


def test_the_clip_cap_is_said_whenever_it_can_cut(
    five_seconds: Path, tmp_path: Path, tiny_vl_model: Path
) -> None:
    assert clip_cap_note(VideoOptions()) is None  # 8 frames: never cut
    assert clip_cap_note(VideoOptions(num_frames=100)) == (
        "num_frames 100 is over the clip cap of 64 frames (max_frames): each clip takes 64"
    )
    assert clip_cap_note(VideoOptions(sampling="fps", fps=25)) == (
        "clips sampled at 25 fps take at most 64 frames (max_frames): a video longer than "
        "2.56 s has 64 of its frames spread evenly"
    )
    out = tmp_path / "clips.jsonl"
    argv = ["caption", str(five_seconds), "--as-clip", "--fps", "25", "--no-progress"]
    argv += ["--model", str(tiny_vl_model), "--out", str(out)]
    assert main(argv, FakeEngine()) == EXIT_OK
    assert summary_of(out)["job"]["notes"] == [clip_cap_note(VideoOptions(sampling="fps", fps=25))]


def test_an_unreadable_folder_is_counted(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every folder")
    (tmp_path / "locked").mkdir()
    (tmp_path / "a.jpg").write_bytes(b"x")
    (tmp_path / "locked").chmod(0)
    log = ListingLog()
    try:
        image_requests([str(tmp_path)], "p", log=log)
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert log.skipped["unreadable folders (Permission denied)"] == 1


def test_exit_codes_are_unchanged_by_notes(five_seconds: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(five_seconds), str(bad), "--num-frames", "2", "--model", "fake"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == EXIT_ITEMS_FAILED
