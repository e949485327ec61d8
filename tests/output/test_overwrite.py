"""``--overwrite``: a new job replaces an output only once it has finished. An engine that
dies, a SIGKILL mid-job or among the final renames, leave the old output whole (or, past
the point of no return, the new one whole); the same command goes on where it stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine, Faults
from repo_paths import FAKE_CLI

from mmbatch.cli import EXIT_INTERRUPTED, EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK
from mmbatch.jobs import Job
from mmbatch.output import replacing
from mmbatch.output.file_output import FileOutput
from mmbatch.output.formats import read_output
from mmbatch.output.paths import OutputPaths
from mmbatch.output.replacing import draft_of
from mmbatch.output.stats import JobStats
from mmbatch.types import MediaRef, Request

PICTURES = {"sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"}


@pytest.fixture
def pictures(tmp_path: Path, samples: Path) -> Path:
    """Four good pictures: every row of a job over them is ok."""
    folder = tmp_path / "pictures"
    shutil.copytree(samples, folder, ignore=lambda _, names: set(names) - PICTURES)
    return folder


def argv(pictures: Path, out: Path, *extra: str) -> list[str]:
    return ["caption", str(pictures), "--model", "fake", "--out", str(out), "--no-progress", *extra]


def files_of(out: Path) -> dict[str, bytes]:
    """Every file of the output at ``out`` (a file or a folder) and beside it, by name."""
    found = {}
    for path in sorted(out.parent.rglob("*")):
        if path.is_file() and path.relative_to(out.parent).parts[0] != "pictures":
            found[str(path.relative_to(out.parent))] = path.read_bytes()
    return found


def prompts(out: Path) -> set[str]:
    return {row["prompt"] for row in read_output(out)}


@pytest.mark.parametrize("name", ["o.jsonl", "o.parquet"])
def test_an_overwrite_that_dies_leaves_the_old_output_and_goes_on_when_run_again(
    pictures: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / name
    assert main(argv(pictures, out, "--prompt", "old"), FakeEngine()) == EXIT_OK
    old = files_of(out)
    new = argv(pictures, out, "--prompt", "new", "--overwrite")
    dying = FakeEngine(per_step=1, faults=Faults(die_after_steps=2))
    capsys.readouterr()
    assert main(new, dying) == EXIT_JOB_FAILED
    assert "replaces" in capsys.readouterr().err  # the rows saved are said to be the draft's
    assert {k: v for k, v in files_of(out).items() if not k.startswith(".")} == old
    rest = FakeEngine()
    assert main(new, rest) == EXIT_OK
    assert len(rest.added) == 2  # the draft resumed: two items were left
    assert prompts(out) == {"new"}
    assert len(list(read_output(out))) == 4
    assert not draft_of(out).parent.exists()
    record = json.loads(OutputPaths(out).record.read_text())
    assert record["fingerprint"]["prompt"] == "new"
    summary = json.loads(OutputPaths(out).summary.read_text())
    assert summary["output"] == str(out)
    idle = FakeEngine()
    assert main(argv(pictures, out, "--prompt", "new"), idle) == EXIT_OK  # now the job's own
    assert idle.added == []


def test_an_overwrite_killed_mid_job_leaves_the_old_output_untouched(
    pictures: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.jsonl"
    assert main(argv(pictures, out, "--max-tokens", "16"), FakeEngine()) == EXIT_OK
    old = files_of(out)
    command = [sys.executable, str(FAKE_CLI), *argv(pictures, out, "--max-tokens", "32")]
    env = os.environ | {"FAKE_TEAR_AT_ROW": "3"}
    killed = subprocess.run([*command, "--overwrite"], env=env, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert {k: v for k, v in files_of(out).items() if not k.startswith(".")} == old
    assert main(argv(pictures, out, "--max-tokens", "32", "--overwrite"), FakeEngine()) == EXIT_OK
    record = json.loads(OutputPaths(out).record.read_text())
    assert record["fingerprint"]["sampling"]["max_tokens"] == 32
    assert len(list(read_output(out))) == 4


def test_a_kill_among_the_final_renames_is_finished_by_the_next_run(
    pictures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o.jsonl"
    (pictures / "empty.png").write_bytes(b"")  # the old output has a quarantine file
    assert main(argv(pictures, out, "--prompt", "old"), FakeEngine()) == EXIT_ITEMS_FAILED
    (pictures / "empty.png").unlink()
    real = replacing.os.replace
    moved = []

    def dies_after_one(src: Path, dst: Path) -> None:
        if Path(dst).parent == out.parent:  # a move of the replacement's into place
            if moved:
                raise KeyboardInterrupt  # as a kill would stop it: nothing after this runs
            moved.append(dst)
        real(src, dst)

    monkeypatch.setattr(replacing.os, "replace", dies_after_one)
    new = argv(pictures, out, "--prompt", "new", "--overwrite")
    assert main(new, FakeEngine()) == EXIT_INTERRUPTED
    monkeypatch.setattr(replacing.os, "replace", real)
    assert moved == [out]  # the rows are new, the record still the old job's
    idle = FakeEngine()
    assert main(argv(pictures, out, "--prompt", "new"), idle) == EXIT_OK  # finished first
    assert idle.added == []
    assert prompts(out) == {"new"}
    assert not OutputPaths(out).quarantine.exists()  # the old job's, gone with it
    assert not draft_of(out).parent.exists()


def test_an_overwrite_leaves_a_file_that_is_no_jobs_output_alone(
    pictures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "notes.jsonl"
    out.write_text('{"mine": 1}\n')
    idle = FakeEngine()
    assert main(argv(pictures, out, "--overwrite"), idle) == EXIT_JOB_FAILED
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"mmbatch: error: {out} has no job record (notes.jsonl.job.json), so it is not known "
        "to be an mmbatch job's output; --overwrite leaves it alone: name another --out"
    )
    assert out.read_text() == '{"mine": 1}\n'
    assert idle.added == []


def test_an_overwrite_of_an_output_in_object_storage_is_one_line_before_anything(
    pictures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    idle = FakeEngine()
    command = ["caption", str(pictures), "--model", "fake", "--out", "s3://bucket/o.jsonl"]
    assert main([*command, "--overwrite"], idle) == EXIT_JOB_FAILED
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "mmbatch: error: --overwrite replaces local outputs only; for an output in object "
        "storage, name another --out"
    )
    assert idle.added == []


def test_an_overwrite_of_a_row_folder_replaces_the_folder_once_finished(tmp_path: Path) -> None:
    """Ray's output, a folder its writers add row files to, is replaced whole, as a file is."""
    picture = (MediaRef("image", "x.jpg"),)

    def job(prompt: str) -> Job:
        return Job([Request(i, prompt, picture) for i in "xy"], fingerprint={"prompt": prompt})

    def write(folder: Path, name: str, prompt: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        rows = [{"id": i, "prompt": prompt, "text": prompt, "error": None} for i in "xy"]
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    folder = tmp_path / "rows"
    old = replace(FileOutput.at(folder), row_folder=True)
    old.ready(job("old"))
    old.record(job("old"))
    write(folder, "a.json", "old")
    new = replace(FileOutput.at(folder, overwrite=True), row_folder=True)
    plan = new.ready(job("new"))
    assert [r.id for r in plan.pending] == ["x", "y"]  # afresh
    new.record(job("new"))
    write(new.path, "b.json", "new")
    assert sorted(p.name for p in folder.iterdir()) == ["a.json"]  # the old, until finished
    report = new.summarise(job("new"), plan, JobStats(), {})
    assert sorted(p.name for p in folder.iterdir()) == ["b.json"]
    assert report.out == folder
    assert json.loads(OutputPaths(folder).record.read_text())["fingerprint"] == {"prompt": "new"}
    assert not draft_of(folder).parent.exists()
