"""The path rule's two ends: a folder walk holds its files to the rule a manifest's paths follow,
and the read opens the very file that was checked when the inputs were listed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fake_cli import main
from fake_engine import FakeEngine

from mmbatch.cli import EXIT_OK
from mmbatch.errors import MediaError, SourceError
from mmbatch.jobs import Job, run_in_memory
from mmbatch.media.fetch import read_file
from mmbatch.media.options import VideoOptions
from mmbatch.media.video import decode_frames, index_video
from mmbatch.openai_batch.reader import read_batch
from mmbatch.pipeline import RunConfig
from mmbatch.sources.files import LINKED_OUT, SourcePolicy, image_requests
from mmbatch.sources.log import ListingLog
from mmbatch.sources.paths import LocalPaths, file_id
from mmbatch.sources.timeline import frame_requests


@pytest.fixture
def secret(tmp_path: Path, samples: Path) -> Path:
    """A picture outside every input's folder."""
    path = tmp_path / "elsewhere" / "secret.png"
    path.parent.mkdir()
    path.write_bytes((samples / "checkerboard.png").read_bytes())
    return path


@pytest.fixture
def photos(tmp_path: Path, samples: Path, secret: Path) -> Path:
    """A folder of a picture, a link to it, and a link out of the folder."""
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    (folder / "same.jpg").symlink_to("a.jpg")  # inside: taken
    (folder / "x.png").symlink_to(secret)  # outside: passed over
    return folder


def names(requests: list) -> set[str]:  # type: ignore[type-arg]
    return {Path(r.id).name for r in requests}


def test_a_walk_passes_over_links_that_leave_the_folder(photos: Path, secret: Path) -> None:
    for named in (str(photos), str(photos / "*.*")):
        log = ListingLog()
        found = image_requests([named], "p", log=log)
        assert names(found) == {"a.jpg", "same.jpg"}, named
        assert log.skipped == {LINKED_OUT: 1}
        assert "1 linked file leading out of the folder" in log.lines()[0]
        assert all(r.media[0].pinned == file_id(str(photos / "a.jpg")) for r in found)
    # Widened as for the paths inside a manifest: a folder allowed, or anywhere.
    for wider in (LocalPaths((str(secret.parent),)), LocalPaths(anywhere=True)):
        found = image_requests([str(photos)], "p", policy=SourcePolicy(wider))
        assert names(found) == {"a.jpg", "same.jpg", "x.png"}
    # Named on the command line, a link is the person's own choice.
    assert names(image_requests([str(photos / "x.png")], "p")) == {"x.png"}
    # A walk that finds nothing else says what it passed over.
    (photos / "a.jpg").unlink()
    (photos / "same.jpg").unlink()
    with pytest.raises(SourceError, match="no images found in ") as nothing:
        image_requests([str(photos)], "p")
    one = LINKED_OUT.replace("files", "file", 1)
    assert str(nothing.value).endswith(f"; passed over while listing the inputs: 1 {one}")


def test_a_walk_through_the_command_does_not_read_the_linked_file(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(photos), "--model", "fake", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_OK
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {Path(r["id"]).name for r in rows} == {"a.jpg", "same.jpg"}
    assert "1 " + LINKED_OUT.replace("files", "file", 1) in capsys.readouterr().err
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summary["job"]["skipped"] == {LINKED_OUT: 1}
    wider = [*argv, "--allow-outside-root"]
    assert main(wider, FakeEngine()) == EXIT_OK
    assert len(out.read_text().splitlines()) == 3


def swap_for_link(path: Path, target: Path) -> None:
    """Replace ``path`` by a symlink to ``target``, as someone who can write to the folder
    could while the engine starts."""
    path.unlink()
    path.symlink_to(target)


def run(requests: list, workers: int = 0) -> list[dict]:  # type: ignore[type-arg]
    run = RunConfig(progress=False, decode_workers=workers)
    rows, _ = run_in_memory(Job(requests), FakeEngine(), run)
    return rows


def assert_not_read(row: dict, path: Path) -> None:  # type: ignore[type-arg]
    error = row["error"]
    assert error is not None, row
    assert (error["stage"], error["kind"]) == ("source", "not_allowed")
    assert f"{str(path)!r} is no longer the file checked" in error["message"]
    assert "it was not read" in error["message"]
    assert row["text"] is None


@pytest.mark.parametrize("input_kind", ["walk", "manifest", "batch"])
def test_a_link_swapped_in_after_listing_is_not_read(
    tmp_path: Path, samples: Path, secret: Path, input_kind: str
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg"):
        shutil.copyfile(samples / "sunset.jpg", folder / name)
    if input_kind == "walk":
        requests = image_requests([str(folder)], "p")
    elif input_kind == "manifest":
        (folder / "m.jsonl").write_text('{"path": "a.jpg"}\n{"path": "b.jpg"}\n')
        requests = image_requests([str(folder / "m.jsonl")], "p")
    else:
        picture = [{"type": "image_url", "image_url": {"url": "b.jpg"}}]
        lines = [
            {"custom_id": name, "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": content}]}}
            for name, content in (("a", "no picture"), ("b", picture))
        ]  # fmt: skip
        (folder / "r.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        requests = read_batch(folder / "r.jsonl").requests
    swap_for_link(folder / "b.jpg", secret)
    rows = {Path(row["id"]).name.removesuffix(".jpg"): row for row in run(requests)}
    assert rows["a"]["error"] is None
    assert_not_read(rows["b"], folder / "b.jpg")


def test_a_folder_swapped_for_a_link_after_listing_is_not_read(
    tmp_path: Path, samples: Path, secret: Path
) -> None:
    """The swap may be of a folder on the way: the pin is the file's, not the name's."""
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    shutil.copyfile(samples / "checkerboard.png", folder / "sub" / "secret.png")
    requests = image_requests([str(folder)], "p")
    shutil.rmtree(folder / "sub")
    (folder / "sub").symlink_to(secret.parent)  # sub/secret.png: the secret, by the same name
    [row] = run(requests)
    assert_not_read(row, folder / "sub" / "secret.png")


def test_a_video_swapped_after_listing_is_not_read(tmp_path: Path, samples: Path) -> None:
    """Frame jobs index a video while listing and read it again later, in decoder processes:
    each open compares the file with the pin, FFmpeg's included."""
    folder, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    shutil.copyfile(samples / "clip.mp4", folder / "v.mp4")
    shutil.copyfile(samples / "clip.mp4", elsewhere / "other.mp4")
    requests = frame_requests([str(folder)], VideoOptions(num_frames=2), "p")
    assert all(r.media[0].pinned is not None for r in requests)
    assert [row["error"] for row in run(requests, workers=1)] == [None, None]
    swap_for_link(folder / "v.mp4", elsewhere / "other.mp4")
    for row in run(requests, workers=1):
        assert_not_read(row, folder / "v.mp4")
    # The decoder itself: an index pins the file it was made from.
    os.unlink(folder / "v.mp4")
    shutil.copyfile(samples / "clip.mp4", folder / "v.mp4")
    path = str(folder / "v.mp4")
    index = index_video(path, pinned=file_id(path))
    assert len(decode_frames(path, index, [0, 1]).frames) == 2  # through /proc/self/fd
    swap_for_link(folder / "v.mp4", elsewhere / "other.mp4")
    with pytest.raises(MediaError, match="no longer the file checked") as caught:
        decode_frames(path, index, [0, 1])
    assert (caught.value.stage, caught.value.kind) == ("source", "not_allowed")


def test_a_path_that_leads_nowhere_when_listed_is_its_rows_error(
    tmp_path: Path, samples: Path, secret: Path
) -> None:
    """Nothing put there later is read: the row says the file was missing."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "m.jsonl").write_text('{"path": "late.jpg"}\n')
    [request] = image_requests([str(folder / "m.jsonl")], "p")
    assert request.error is not None
    assert (request.error.stage, request.error.kind) == ("load", "unreadable")
    assert f"cannot read {str(folder / 'late.jpg')!r}: it does not exist" in request.error.message
    (folder / "late.jpg").symlink_to(secret)
    [row] = run([request])
    assert row["error"]["kind"] == "unreadable"


def test_a_link_swapped_between_the_check_and_the_open_is_not_read(
    tmp_path: Path, samples: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap lands after the check made before opening, right before the open itself:
    only the comparison made on the open descriptor can see it."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg"):
        shutil.copyfile(samples / "sunset.jpg", folder / name)
    a, b = image_requests([str(folder)], "p")
    real_open = os.open
    swaps: list[str] = []

    def swap_then_open(name: Any, *args: Any, **kwargs: Any) -> int:
        if Path(name).parent == folder and name not in swaps:
            swaps.append(name)
            swap_for_link(Path(name), secret)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap_then_open)
    with pytest.raises(MediaError, match="no longer the file checked") as caught:
        read_file(a.media[0].source, pinned=a.media[0].pinned)
    assert (caught.value.stage, caught.value.kind) == ("source", "not_allowed")
    [row] = run([b])
    assert_not_read(row, folder / "b.jpg")
    assert swaps == [str(folder / "a.jpg"), str(folder / "b.jpg")]
