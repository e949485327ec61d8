"""File names that are not UTF-8 (``x_\\xff.jpg``: a Linux name is bytes) go the whole way:
listed, read, captioned, written to every output format, quarantined, resumed and shown in
the gallery, each as one row whose id is text and whose source still opens the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine, expected_text
from media_files import cfr_video

from mmbatch import cli
from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_OK
from mmbatch.jsonl import printable
from mmbatch.output.formats import read_output

GOOD = os.fsdecode(b"x_\xff.jpg")  # the str Python hands over for that name: "x_\udcff.jpg"
BAD = os.fsdecode(b"bad_\xfe.jpg")


@pytest.fixture
def folder(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / GOOD).write_bytes((samples / "sunset.jpg").read_bytes())
    (folder / BAD).write_bytes(b"not a picture")
    (folder / "plain.png").write_bytes((samples / "checkerboard.png").read_bytes())
    return folder


def caption(folder: Path, out: Path, *extra: str) -> int:
    argv = ["caption", str(folder), "--model", "fake", "--out", str(out), "--no-progress"]
    return main([*argv, *extra], FakeEngine())


def test_printable_escapes_only_what_is_not_text() -> None:
    assert printable(GOOD) == "x_\\xff.jpg"
    assert printable("café.jpg") == "café.jpg"
    assert printable("\ud800") == "\\ud800"  # a lone surrogate no OS byte made


def test_names_that_are_not_utf8_go_through_a_jsonl_job_and_its_rerun(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.jsonl"
    assert caption(folder, out) == EXIT_ITEMS_FAILED
    out.read_bytes().decode("utf-8")  # the file is UTF-8 text
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    good_id, bad_id = str(folder / "x_\\xff.jpg"), str(folder / "bad_\\xfe.jpg")
    assert set(rows) == {good_id, bad_id, str(folder / "plain.png")}
    assert rows[good_id]["source"] == str(folder / GOOD)  # the exact name: it opens the file
    assert Path(rows[good_id]["source"]).is_file()
    good = rows[good_id]
    assert good["text"] == expected_text([good["media_hash"]], good["prompt"])
    assert rows[bad_id]["error"]["kind"] == "not_media"
    quarantine = tmp_path / "o.jsonl.quarantine.jsonl"
    [failed] = map(json.loads, quarantine.read_text().splitlines())
    assert (failed["id"], failed["source"]) == (bad_id, str(folder / BAD))
    json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    before = out.read_bytes()
    assert caption(folder, out) == EXIT_ITEMS_FAILED  # resumed: every id is found again
    assert out.read_bytes() == before
    assert caption(folder, out, "--retry-errors") == EXIT_ITEMS_FAILED
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.parametrize("fmt", ["parquet", "datasets"])
def test_names_that_are_not_utf8_go_into_columnar_outputs(
    folder: Path, tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / ("o.parquet" if fmt == "parquet" else "o")
    for _ in range(2):  # the rerun reads the finished output back and finds every id
        assert caption(folder, out, "--out-format", fmt) == EXIT_ITEMS_FAILED
    rows = {row["id"]: row for row in read_output(out)}
    assert len(rows) == 3
    assert rows[str(folder / "x_\\xff.jpg")]["source"] == str(folder / "x_\\xff.jpg")


def test_frames_of_a_video_whose_name_is_not_utf8(tmp_path: Path) -> None:
    video = cfr_video(tmp_path / os.fsdecode(b"clip_\xff.mp4"), frames=10)
    out = tmp_path / "frames.jsonl"
    argv = ["frames", str(video), "--num-frames", "2", "--model", "fake", "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    rows = list(map(json.loads, out.read_text().splitlines()))
    assert [r["id"].split("@")[0] for r in rows] == [printable(str(video))] * 2
    assert all(r["video"] == str(video) for r in rows)


def test_the_gallery_shows_names_that_are_not_utf8(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    caption(folder, out)
    page = tmp_path / "report.html"
    assert cli.main(["report", str(out), "--html", str(page)]) == EXIT_OK
    html = page.read_text(encoding="utf-8")
    assert "x_\\xff.jpg" in html
    assert html.count("data:image/jpeg;base64,") == 2  # the exact source found the file


def test_two_names_that_escape_to_one_id_are_refused(tmp_path: Path) -> None:
    from mmbatch.errors import SourceError
    from mmbatch.sources.files import image_requests

    (tmp_path / GOOD).write_bytes(b"x")
    (tmp_path / "x_\\xff.jpg").write_bytes(b"x")  # a name with a real backslash in it
    with pytest.raises(SourceError, match="duplicate id"):
        image_requests([str(tmp_path)], "p")
