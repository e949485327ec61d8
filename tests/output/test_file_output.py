"""What a run asks of its output (``FileOutput``), as Ray's driver asks it of a folder that
Ray's writers filled: the run's own stats counted off the rows, each item with exactly one
row, and the summary over the whole folder."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from mmbatch.errors import ConfigError
from mmbatch.jobs import Job
from mmbatch.output.file_output import FileOutput
from mmbatch.output.rows import output_row
from mmbatch.types import ItemError, MediaRef, Request, Result, Usage

PICTURE = (MediaRef("image", "x.jpg"),)


def folder_of_rows(folder: Path, results: list[Result], job: Job) -> FileOutput:
    """A row folder as Ray's writers leave it: the rows of ``results``, in two files."""
    folder.mkdir()
    by_id = {r.id: r for r in job.requests}
    rows = [output_row(by_id[r.request_id], ("key",), r) for r in results]
    half = len(rows) // 2
    for name, part in (("a.json", rows[:half]), ("b.json", rows[half:])):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in part))
    return FileOutput(folder, "jsonl", row_folder=True)


def test_a_runs_stats_are_counted_off_the_rows_others_wrote(tmp_path: Path) -> None:
    job = Job([Request(i, "p", PICTURE) for i in "wxyz"])
    failed = ItemError("decode", "truncated", "corrupt")
    results = [
        Result("w", "earlier", "stop", Usage(9, 9)),
        Result("x", "t", "stop", Usage(5, 2)),
        Result("y", error=failed),
        Result("z", "t", "length", Usage(4, 3, 1)),
    ]
    out = folder_of_rows(tmp_path / "rows", results, job)
    out.record(job)
    plan = out.ready(job)
    assert plan.pending == []
    started = time.perf_counter()
    run = out.run_stats(job, {"x", "y", "z"}, started)  # w's row is an earlier run's
    assert (run.total, run.ok, run.failed) == (3, 2, 1)
    assert (run.prompt_tokens, run.output_tokens, run.cached_tokens) == (9, 5, 1)
    assert run.failed_by_kind == {"corrupt": 1}
    assert run.started == started
    assert run.finished is not None
    report = out.summarise(job, plan, run, {"model": "m"})
    assert (report.total, report.output.ok, report.output.failed) == (4, 3, 1)
    summary = json.loads(report.summary_path.read_text())
    assert (summary["stats"]["ok"], summary["job"]["model"]) == (3, "m")
    quarantined = out.paths.quarantine.read_text().splitlines()
    assert [json.loads(line)["id"] for line in quarantined] == ["y"]


@pytest.mark.parametrize(
    ("ids", "said"),
    [("xy", "1 ids have no row (e.g. ['z']), 0 have several"), ("xyzz", "1 have several")],
)
def test_an_output_that_is_not_one_row_per_item_is_a_bug_said_as_such(
    tmp_path: Path, ids: str, said: str
) -> None:
    job = Job([Request(i, "p", PICTURE) for i in "xyz"])
    out = folder_of_rows(tmp_path / "rows", [Result(i, "t", "stop") for i in ids], job)
    bug = "bug: the output is not one row per input: "
    with pytest.raises(RuntimeError, match=re.escape(bug) + ".*" + re.escape(said)):
        out.run_stats(job, set("xyz"), time.perf_counter())


def test_record_and_ready_refuse_another_jobs_rows(tmp_path: Path) -> None:
    job = Job([Request("x", "p", PICTURE)], fingerprint={"prompt": "p"})
    out = folder_of_rows(tmp_path / "rows", [Result("x", "t", "stop")], job)
    out.record(Job([], fingerprint={"prompt": "another"}))
    with pytest.raises(ConfigError, match="was written by a different job"):
        out.ready(job)
    out.record(job)
    assert out.ready(job).kept_ok == 1
    assert out.count(job).ok == 1
