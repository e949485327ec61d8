"""The files around an output behave like any file the user makes: created with the mode the
user's umask gives, a replaced file keeping its mode, no temporary file left behind by a
killed job; the resume notice and the summary count items, not requests; the gallery reads
any row."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import RECIPES

from mmbatch import cli
from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_OK


@pytest.fixture
def umask_002() -> Iterator[None]:
    before = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def pictures(tmp_path: Path, samples: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    (folder / "b.jpg").write_bytes(b"broken")
    return folder


@pytest.mark.usefixtures("umask_002")
def test_every_file_of_a_job_gets_the_users_umask_and_keeps_its_mode(
    pictures: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(pictures), "--model", "fake", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    made = [out, *(out.with_name(out.name + s) for s in (".job.json", ".summary.json"))]
    made.append(out.with_name(out.name + ".quarantine.jsonl"))
    assert {p.name: mode(p) for p in made} == {p.name: 0o664 for p in made}
    out.chmod(0o640)
    assert main([*argv, "--retry-errors"], FakeEngine()) == EXIT_ITEMS_FAILED  # rewrites it
    assert mode(out) == 0o640


def test_a_killed_jobs_temporary_files_are_removed_by_the_next_run(
    pictures: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(pictures), "--model", "fake", "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    orphans = [
        tmp_path / ".o.jsonl.quarantine.jsonl.k2j4h5g6.tmp",  # as mkstemp named them
        tmp_path / ".o.jsonl.job.json.0a1b2c3d.tmp",
        tmp_path / ".o.jsonl.summary.json.x.tmp",
    ]
    for orphan in orphans:
        orphan.write_text("half")
    other = tmp_path / ".other.jsonl.12345678.tmp"  # not this job's: left alone
    other.write_text("theirs")
    assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    assert not any(orphan.exists() for orphan in orphans)
    assert other.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [other.name]


def test_resuming_a_recipe_counts_items_not_requests(
    tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        (folder / f"p{i}.jpg").write_bytes((samples / "sunset.jpg").read_bytes())
    out = tmp_path / "answers.jsonl"
    recipe = RECIPES / "multi_question.toml"
    argv = ["run", str(recipe), str(folder), "--model", "fake", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == EXIT_OK
    out.write_text(out.read_text().splitlines(keepends=True)[0])  # two items lost
    capsys.readouterr()
    assert main([*argv, "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "1 item already has a row; 2 items to do" in err
    assert "2 of 2 items: 2 ok" in err
    stats = json.loads(out.with_name(out.name + ".summary.json").read_text())["stats"]
    assert (stats["total"], stats["ok"], stats["rows_from_earlier_runs"]) == (3, 3, 1)
    # What a user timing the command sees: from the process's start, imports included.
    assert 0 < stats["startup_seconds"] <= stats["process_seconds"]
    assert f"time: {stats['process_seconds']:.1f} s for the whole command: start-up" in err


def test_the_gallery_reads_a_row_whose_frame_fields_are_not_numbers(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    rows = [
        {"id": "v@1", "source": "v.mp4", "frame_index": "seven", "pts": 1.0, "error": None},
        {"id": "v@2", "source": "v.mp4", "frame_index": 2, "pts": [], "error": None},
    ]
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = tmp_path / "r.html"
    assert cli.main(["report", str(out), "--html", str(page)]) == EXIT_OK
    html = page.read_text()
    assert "no preview: frame_index &#x27;seven&#x27; is not a frame number" in html
    assert "no preview: pts [] is not a time in seconds" in html


def process_seconds_of(argv: list[str]) -> float:
    import subprocess

    return float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def test_process_seconds_count_the_interpreters_start_up_before_mmbatchs_import() -> None:
    """Work the interpreter did before it imported mmbatch (Python's start, imports) is the
    command's too."""
    import sys

    code = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
    code += "from mmbatch.clock import process_seconds; print(process_seconds())"
    assert 0.5 <= process_seconds_of([sys.executable, "-c", code]) < 30


def test_process_seconds_do_not_count_what_ran_before_an_exec() -> None:
    """``bash -c 'setup && exec mmbatch ...'``: the process is the shell's, started with the
    setup; the command's start is the interpreter's."""
    import shlex
    import subprocess
    import sys
    import time

    code = "import time; from mmbatch.clock import process_seconds\n"
    code += "print(process_seconds(), time.time())"
    shell = f"sleep 2; exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    began = time.time()
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    seconds, printed_at = map(float, done.stdout.split())
    # The interpreter began 2 s (the setup) or more after the shell: however slow a loaded
    # machine makes its start, the command's seconds are fewer than the time since then.
    assert 0 < seconds <= printed_at - began - 2.0 + 0.05
