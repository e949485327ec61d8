"""Only regular files are read: a FIFO or a device named like media is an error row, never a
hang or an endless read; a read is bounded in bytes. Each command runs in a subprocess with a
time limit, so that a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from media_files import write_audio
from repo_paths import FAKE_CLI

from mmbatch.errors import MediaError
from mmbatch.media.container import open_media
from mmbatch.media.fetch import open_regular, read_source
from mmbatch.media.hashing import file_digest


def fake_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FAKE_CLI), *argv, "--model", "fake", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def rows_of(out: Path) -> dict[str, dict[str, object]]:
    return {Path(r["id"]).name: r for r in map(json.loads, out.read_text().splitlines())}


@pytest.fixture
def specials(tmp_path: Path, samples: Path) -> Path:
    """A folder of a real picture beside a FIFO and devices named like media."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    os.mkfifo(folder / "b.jpg")
    (folder / "zero.png").symlink_to("/dev/zero")  # read whole, it would never end
    (folder / "random.jpg").symlink_to("/dev/urandom")
    return folder


@pytest.fixture
def av_fifos(tmp_path: Path) -> Path:
    folder = tmp_path / "av"
    folder.mkdir()
    os.mkfifo(folder / "c.mp4")
    os.mkfifo(folder / "d.wav")
    return folder


def test_a_fifo_or_a_device_named_like_media_is_an_error_row_not_a_hang(
    specials: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.jsonl"
    # The walk passes over the links to devices (they lead out of the folder); named on the
    # command line, they are read as named.
    devices = [str(specials / "zero.png"), str(specials / "random.jpg")]
    proc = fake_cli("caption", str(specials), *devices, "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "2 linked files leading out of the folder" in proc.stderr
    rows = rows_of(out)
    assert set(rows) == {"a.jpg", "b.jpg", "zero.png", "random.jpg"}
    assert rows["a.jpg"]["error"] is None
    for name, kind in [
        ("b.jpg", "a FIFO (named pipe)"),
        ("zero.png", "a character device"),
        ("random.jpg", "a character device"),
    ]:
        error = rows[name]["error"]
        assert isinstance(error, dict), name
        assert (error["stage"], error["kind"]) == ("load", "unsupported"), name
        assert f"is {kind}, not a regular file" in error["message"]


def test_frame_jobs_refuse_a_fifo_while_listing(av_fifos: Path, tmp_path: Path) -> None:
    out = tmp_path / "frames.jsonl"
    proc = fake_cli("frames", str(av_fifos / "c.mp4"), "--num-frames", "2", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    [row] = rows_of(out).values()
    assert row["error"]["kind"] == "unsupported"  # type: ignore[index]


def test_clips_and_audio_refuse_a_fifo(av_fifos: Path) -> None:
    from media_loader import MediaLoader

    from mmbatch.media.options import AudioOptions
    from mmbatch.sources.timeline import audio_requests
    from mmbatch.types import MediaRef, Request

    [audio] = audio_requests([str(av_fifos / "d.wav")], AudioOptions(), "Listen.")
    assert audio.error is not None
    assert audio.error.kind == "unsupported"
    clip = Request("c", "Describe.", (MediaRef("video", str(av_fifos / "c.mp4")),))
    [failure] = MediaLoader().load([clip]).failures
    assert failure.error is not None
    assert failure.error.kind == "unsupported"


def test_each_reader_refuses_what_is_not_a_regular_file(specials: Path, tmp_path: Path) -> None:
    for reader in (
        lambda p: read_source(p, None),
        lambda p: file_digest(p),
        lambda p: open_media(p).close(),
        lambda p: open_regular(p).close(),
    ):
        for name in ("b.jpg", "zero.png"):
            with pytest.raises(MediaError, match="not a regular file") as info:
                reader(str(specials / name))
            assert (info.value.stage, info.value.kind) == ("load", "unsupported")
        with pytest.raises(MediaError, match="a folder"):
            reader(str(tmp_path))
        with pytest.raises(MediaError, match="does not exist") as missing:
            reader(str(tmp_path / "nope.jpg"))
        assert missing.value.kind == "unreadable"
    assert file_digest(str(specials / "a.jpg"))[1] > 0
    probe = write_audio(tmp_path / "tone.wav", rate=8000, seconds=0.2, layout="mono")
    open_media(str(probe)).close()


def test_a_read_is_bounded_in_bytes_whatever_the_file_system_says(
    samples: Path, tmp_path: Path
) -> None:
    picture = str(samples / "sunset.jpg")
    size = os.path.getsize(picture)
    assert len(read_source(picture, None, max_bytes=size)) == size
    with pytest.raises(MediaError, match="over the size limit") as info:
        read_source(picture, None, max_bytes=size - 1)
    assert (info.value.stage, info.value.kind) == ("load", "too_large")
    # /proc files report a size of 0 and hold more: the bound is on the bytes read.
    status = tmp_path / "status.jpg"
    status.symlink_to("/proc/self/status")
    assert os.path.getsize(status) == 0
    with pytest.raises(MediaError, match="over the size limit"):
        read_source(str(status), None, max_bytes=16)
