"""Sharded outputs: Parquet shards of N rows, and WebDataset tar shards holding each item's
media, row and text, as img2dataset writes them; in input order, resumable."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fake_cli import main
from fake_engine import FakeEngine, Faults
from PIL import Image

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
from mmbatch.output.formats import read_output

NAMES = ["a.jpg", "b.png", "c.jpg", "d.png", "e.jpg"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """``NAMES`` as pictures no two alike: each item a request of its own (identical ones
    would be answered once, ``mmbatch.repeats``, and a dying engine stop elsewhere)."""
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for n, name in enumerate(NAMES):
        Image.new("RGB", (24, 24), (40 * n, 255 - 40 * n, 90)).save(pictures / name)
    return pictures


def caption(folder: Path, out: Path, *extra: str, engine: FakeEngine | None = None) -> int:
    argv = ["caption", str(folder), "--model", "m", "--out", str(out), "--no-progress"]
    return main([*argv, *extra], engine or FakeEngine(per_step=2))


def test_parquet_shards_of_n_rows(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "captions"
    assert caption(folder, out, "--out-format", "parquet", "--shard-rows", "2") == EXIT_OK
    shards = sorted(p.name for p in out.iterdir())
    assert shards == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.read_metadata(out / s).num_rows for s in shards] == [2, 2, 1]
    schemas = {str(pq.read_schema(out / s)) for s in shards}
    assert len(schemas) == 1  # one schema in every shard
    assert [Path(r["id"]).name for r in read_output(out)] == NAMES
    assert not (tmp_path / "captions.rows.jsonl").exists()


def test_webdataset_shards_hold_media_row_and_text(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "wds"
    assert caption(folder, out, "--out-format", "webdataset", "--shard-rows", "3") == EXIT_OK
    assert sorted(p.name for p in out.iterdir()) == ["00000.tar", "00001.tar"]
    with tarfile.open(out / "00000.tar") as tar:
        members = tar.getnames()
        assert members[:3] == ["000000000.jpg", "000000000.txt", "000000000.json"]
        picture = tar.extractfile("000000001.png")
        assert picture is not None
        assert picture.read() == (folder / "b.png").read_bytes()
        row = json.loads(tar.extractfile("000000001.json").read())  # type: ignore[union-attr]
        text = tar.extractfile("000000001.txt").read().decode()  # type: ignore[union-attr]
    assert Path(row["id"]).name == "b.png"
    assert text == row["text"]
    with tarfile.open(out / "00001.tar") as tar:
        assert len(tar.getnames()) == 2 * 3
    assert [Path(r["id"]).name for r in read_output(out)] == NAMES


def test_shards_resume_from_their_spool(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "wds"
    fmt = ["--out-format", "webdataset", "--shard-rows", "2"]
    dying = FakeEngine(per_step=1, faults=Faults(die_after_steps=2))
    assert caption(folder, out, *fmt, engine=dying) == EXIT_JOB_FAILED
    assert len(list(read_output(out))) == 2
    rest = FakeEngine()
    assert caption(folder, out, *fmt, engine=rest) == EXIT_OK
    assert len(rest.added) == 3
    assert [Path(r["id"]).name for r in read_output(out)] == NAMES
    idle = FakeEngine()
    assert caption(folder, out, *fmt, engine=idle) == EXIT_OK  # finished: read back, kept
    assert idle.added == []
    assert [Path(r["id"]).name for r in read_output(out)] == NAMES


def test_shards_of_a_format_without_them_are_refused(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    assert caption(folder, out, "--shard-rows", "2") == EXIT_JOB_FAILED
    assert "--shard-rows applies to parquet and webdataset outputs, not jsonl" in (
        capsys.readouterr().err
    )
    assert not out.exists()


def test_shards_that_cannot_be_written_are_one_line_and_the_spool_waits(
    folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A full disk while the shards are written: one line, exit 2, no half folder; the spool
    keeps every row, and the next run writes the shards without asking the engine again."""
    import errno
    import os

    from mmbatch.output import shards

    def full(spool: Path, folder: Path, size: int) -> None:
        (folder / "part-00000.parquet").write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "captions"
    fmt = ["--out-format", "parquet", "--shard-rows", "2"]
    with monkeypatch.context() as patched:
        patched.setattr(shards, "_write_parquet_shards", full)
        assert caption(folder, out, *fmt) == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    assert f"mmbatch: error: cannot write {str(out)!r}: No space left on device" in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "captions.job.json",
        "captions.rows.jsonl",
        "pictures",
    ]
    again = FakeEngine()
    assert caption(folder, out, *fmt, engine=again) == EXIT_OK
    assert again.added == []
    assert [Path(r["id"]).name for r in read_output(out)] == NAMES
