"""Finished outputs hold their rows in input order, though the engine finishes requests in
its own order (the fake engine finishes the newest first) and rows are written as they
finish."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine, Faults
from PIL import Image

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
from mmbatch.jobs import Job, run_in_memory
from mmbatch.output.formats import read_output
from mmbatch.output.order import RowOrder
from mmbatch.pipeline import RunConfig
from mmbatch.sources.files import image_requests

NAMES = ["a.jpg", "b.png", "c.jpg", "d.png", "e.jpg", "f.png"]


@pytest.fixture
def folder(tmp_path: Path, samples: Path) -> Path:
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for name, sample in zip(NAMES, ["sunset.jpg", "checkerboard.png"] * 3, strict=True):
        shutil.copyfile(samples / sample, pictures / name)
    return pictures


@pytest.fixture
def distinct(tmp_path: Path) -> Path:
    """``NAMES`` as pictures no two alike: each item a request of its own (copies of one
    picture are answered once, ``mmbatch.repeats``)."""
    pictures = tmp_path / "distinct"
    pictures.mkdir()
    for n, name in enumerate(NAMES):
        Image.new("RGB", (24, 24), (40 * n, 255 - 40 * n, 90)).save(pictures / name)
    return pictures


def caption(folder: Path, out: Path, *extra: str, engine: FakeEngine | None = None) -> int:
    argv = ["caption", str(folder), "--model", "m", "--out", str(out), "--no-progress"]
    return main([*argv, *extra], engine or FakeEngine(per_step=2))


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.parquet"])
def test_a_finished_output_is_in_input_order(folder: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    engine = FakeEngine(per_step=2)
    assert caption(folder, out, engine=engine) == EXIT_OK
    # The planner groups the three copies of one picture, the fake finishes backwards...
    assert [Path(i).name for i in engine.added] != NAMES
    rows = list(read_output(out))
    assert [Path(r["id"]).name for r in rows] == NAMES  # ...and the output is in input order


def test_a_resumed_output_ends_in_input_order(distinct: Path, tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    # One answer a step: two rows, however many requests the first step found ready.
    dying = FakeEngine(per_step=1, faults=Faults(die_after_steps=2))
    assert caption(distinct, out, engine=dying) == EXIT_JOB_FAILED
    first = [Path(json.loads(line)["id"]).name for line in out.read_text().splitlines()]
    assert len(first) == 2
    assert caption(distinct, out) == EXIT_OK
    assert [Path(json.loads(line)["id"]).name for line in out.read_text().splitlines()] == NAMES


def test_rows_of_other_items_stay_after_the_job(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    assert caption(folder / "c.jpg", out) == EXIT_OK
    assert caption(folder, out, "--force") == EXIT_OK
    ids = [Path(json.loads(line)["id"]).name for line in out.read_text().splitlines()]
    assert ids == NAMES  # c.jpg is one of this job's items: in its place
    assert caption(folder / "a.jpg", out, "--force") == EXIT_OK
    ids = [Path(json.loads(line)["id"]).name for line in out.read_text().splitlines()]
    assert ids == ["a.jpg", "b.png", "c.jpg", "d.png", "e.jpg", "f.png"]


def test_in_memory_rows_come_back_in_input_order(folder: Path) -> None:
    requests = image_requests([str(folder)], "Describe.")
    rows, _ = run_in_memory(Job(requests), FakeEngine(per_step=4), RunConfig(progress=False))
    assert [row["id"] for row in rows] == [r.id for r in requests]


def test_reordering_keeps_every_byte_of_every_row(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    lines = ['{"id": "2", "text": "zwei ü"}', '{"id": "9"}', '{"id": "1", "x": [1, 2]}']
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    order = RowOrder(["1", "2", "3"], lambda row: str(row["id"]))
    assert order.apply(path) is True
    assert path.read_text(encoding="utf-8").splitlines() == [lines[2], lines[0], lines[1]]
    assert order.apply(path) is False  # already in order: left as it is
