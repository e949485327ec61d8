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


LOOKALIKE = "x_\\xff.jpg"
"""A name of ten characters (a real backslash in it) spelling the id of ``GOOD``'s name."""


def test_a_name_spelling_anothers_escape_has_an_id_of_its_own_on_every_run(
    tmp_path: Path, samples: Path
) -> None:
    """The file dropped beside ``GOOD`` later neither stops the job (no "duplicate id") nor
    takes ``GOOD``'s row on resume: each id is made from its own name alone (a backslash is
    escaped too), so the ids are the same whichever file came first."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / GOOD).write_bytes((samples / "sunset.jpg").read_bytes())
    out = tmp_path / "o.jsonl"
    assert caption(folder, out) == EXIT_OK
    first = out.read_text()
    (folder / LOOKALIKE).write_bytes((samples / "arrow_exif_rotated.jpg").read_bytes())
    assert caption(folder, out) == EXIT_OK  # resumed: GOOD's row kept, the new file's added
    assert first in out.read_text()  # the row kept as it was written (the output in order)
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    good_id, lookalike_id = str(folder / "x_\\xff.jpg"), str(folder / "x_\\\\xff.jpg")
    assert {i: row["source"] for i, row in rows.items()} == {
        good_id: str(folder / GOOD),
        lookalike_id: str(folder / LOOKALIKE),
    }
    for row in rows.values():  # each row is its own file's answer
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])
    assert rows[good_id]["media_hash"] != rows[lookalike_id]["media_hash"]
    fresh = tmp_path / "fresh.jsonl"  # both there from the start: the same ids
    assert caption(folder, fresh) == EXIT_OK
    assert {json.loads(line)["id"] for line in fresh.read_text().splitlines()} == set(rows)


def test_frames_of_two_such_videos_have_ids_of_their_own(tmp_path: Path) -> None:
    from mmbatch.sources.timeline import frame_id

    odd, lookalike = str(tmp_path / os.fsdecode(b"v_\xff.mp4")), str(tmp_path / "v_\\xff.mp4")
    assert frame_id(odd, 1.0) == printable(odd) + "@1.000"
    assert frame_id(lookalike, 1.0) == str(tmp_path / "v_\\\\xff.mp4") + "@1.000"
