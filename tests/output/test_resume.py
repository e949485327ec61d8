"""Resuming from the output file: torn lines, fingerprints, --retry-errors, the quarantine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmbatch.errors import ConfigError
from mmbatch.jobs import Job
from mmbatch.output.paths import OutputPaths
from mmbatch.output.resume import ResumePlan, prepare, repair_torn_tail, write_record
from mmbatch.output.resume import read_rows as read_checked
from mmbatch.output.rows import FLAT
from mmbatch.output.sinks import JsonlSink
from mmbatch.output.stats import count_output
from mmbatch.types import MediaRef, Request

FINGERPRINT = {"command": "caption", "model": "m", "prompt": "Describe.", "sampling": {"t": 0}}


def requests(n: int) -> list[Request]:
    return [
        Request(f"item-{i}", "Describe.", (MediaRef("image", f"/data/{i}.jpg"),)) for i in range(n)
    ]


def resume(
    out: Path, todo: list[Request], fingerprint: dict[str, object] = FINGERPRINT, **rules: bool
) -> ResumePlan:
    """``prepare`` the output, then record the job, as a run that starts does."""
    paths = OutputPaths(out)
    plan = prepare(paths, Job(todo, fingerprint=fingerprint), **rules)
    write_record(paths.record, fingerprint)
    return plan


def row(item_id: str, error: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "id": item_id,
        "source": f"/data/{item_id}.jpg",
        "prompt": "Describe.",
        "text": None if error else f"text of {item_id}",
        "error": error,
    }


def read_rows(out: Path) -> list[dict[str, object]]:
    return list(read_checked(out, FLAT))


def ids(n: int) -> set[str]:
    return {r.row_id for r in requests(n)}


def write_rows(path: Path, rows: list[dict[str, object]], tail: bytes = b"") -> None:
    with path.open("wb") as handle:
        for r in rows:
            handle.write((json.dumps(r) + "\n").encode())
        handle.write(tail)


def test_a_torn_last_line_is_cut_and_whole_rows_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    write_rows(out, [row("a"), row("b")], tail=b'{"id": "c", "text": "half a ro')
    whole = out.read_bytes()[: -len(b'{"id": "c", "text": "half a ro')]
    assert repair_torn_tail(out) == len(b'{"id": "c", "text": "half a ro')
    assert out.read_bytes() == whole
    assert [r["id"] for r in read_rows(out)] == ["a", "b"]
    assert repair_torn_tail(out) == 0  # idempotent


def test_a_last_line_of_garbage_with_its_newline_is_torn_too(tmp_path: Path) -> None:
    # What a power cut can leave: the newline made it to disk, the data before it did not.
    out = tmp_path / "o.jsonl"
    write_rows(out, [row("a")], tail=b"\x00\x00\x00\x00\n")
    assert repair_torn_tail(out) == 5
    assert [r["id"] for r in read_rows(out)] == ["a"]


def test_a_file_with_no_whole_line_is_emptied(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    out.write_bytes(b'{"id": "a", "te')
    assert repair_torn_tail(out) == 15
    assert out.read_bytes() == b""


def test_damage_before_the_last_line_is_refused_not_guessed(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    write_rows(out, [row("a")], tail=b"not json\n" + (json.dumps(row("b")) + "\n").encode())
    assert repair_torn_tail(out) == 0
    with pytest.raises(
        ConfigError, match=r"o\.jsonl:2: not valid JSON.*damaged beyond a torn last line"
    ):
        list(read_rows(out))


def test_two_rows_for_one_id_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    write_rows(out, [row("a"), row("a")])
    with pytest.raises(ConfigError, match="a second row for id 'a'"):
        list(read_rows(out))


def test_fresh_job_does_everything_and_records_its_fingerprint(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    plan = resume(out, requests(3))
    assert [r.id for r in plan.pending] == ["item-0", "item-1", "item-2"]
    assert plan.describe(out) is None
    record = json.loads(OutputPaths(out).record.read_text())
    assert record["fingerprint"] == FINGERPRINT
    assert OutputPaths(out).record.name == "o.jsonl.job.json"


def test_resume_skips_items_with_a_row_ok_or_error(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    resume(out, requests(4))
    write_rows(out, [row("item-2"), row("item-0", {"stage": "decode", "message": "bad"})])
    plan = resume(out, requests(4))
    assert [r.id for r in plan.pending] == ["item-1", "item-3"]
    assert (plan.kept_ok, plan.kept_failed, plan.retried) == (1, 1, 0)
    assert "2 items already have a row, 1 of them errors" in (plan.describe(out) or "")


def test_resume_repairs_the_torn_line_and_redoes_its_item(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    resume(out, requests(3))
    write_rows(out, [row("item-0")], tail=b'{"id": "item-1", "tex')
    plan = resume(out, requests(3))
    assert [r.id for r in plan.pending] == ["item-1", "item-2"]
    assert plan.repaired_bytes == len(b'{"id": "item-1", "tex')
    assert "torn last line" in (plan.describe(out) or "")
    # Appending now continues cleanly after the last whole row.
    with JsonlSink(out, append=True) as sink:
        sink.write(row("item-1"))
    assert [r["id"] for r in read_rows(out)] == ["item-0", "item-1"]


def test_retry_errors_removes_error_rows_so_no_id_gets_two(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    resume(out, requests(3))
    bad = {"stage": "decode", "kind": "corrupt", "message": "bad"}
    other_job_error = row("not-in-this-job", bad)
    write_rows(out, [row("item-0", bad), row("item-1"), row("item-2", bad), other_job_error])
    plan = resume(out, requests(3), retry_errors=True)
    assert [r.id for r in plan.pending] == ["item-0", "item-2"]
    assert plan.retried == 2
    # Only this job's error rows go; rows of other ids are not this job's to drop.
    assert [r["id"] for r in read_rows(out)] == ["item-1", "not-in-this-job"]


def test_another_fingerprint_is_refused_with_what_changed_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    resume(out, requests(2))
    write_rows(out, [row("item-0")])
    changed = {**FINGERPRINT, "prompt": "List tags."}
    with pytest.raises(ConfigError, match=r"\(the prompt changed\).*--overwrite.*--force"):
        resume(out, requests(2), changed)
    assert out.read_bytes() == (json.dumps(row("item-0")) + "\n").encode()  # untouched
    plan = resume(out, requests(2), changed, force=True)
    assert [r.id for r in plan.pending] == ["item-1"]
    assert json.loads(OutputPaths(out).record.read_text())["fingerprint"] == changed
    assert resume(out, requests(2), changed).pending == plan.pending  # now the job's own


def test_a_setting_a_newer_version_adds_unset_is_the_same_job(tmp_path: Path) -> None:
    """An output written before a setting existed (``sampling.logprobs``) resumes under a
    version that records it unset: the digests differ, the settings do not."""
    out = tmp_path / "o.jsonl"
    older = {**FINGERPRINT, "sampling": {"max_tokens": 16}}
    resume(out, requests(2), older)
    write_rows(out, [row("item-0")])
    newer = {**FINGERPRINT, "sampling": {"max_tokens": 16, "logprobs": None}}
    assert [r.id for r in resume(out, requests(2), newer).pending] == ["item-1"]
    set_now = {**FINGERPRINT, "sampling": {"max_tokens": 16, "logprobs": 2}}
    with pytest.raises(ConfigError, match=r"\(--logprobs unset -> 2\)"):
        resume(out, requests(2), set_now)


def test_rows_without_a_job_record_are_not_appended_to(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    write_rows(out, [row("item-0")])
    with pytest.raises(ConfigError, match=r"no job record \(o\.jsonl\.job\.json\)"):
        resume(out, requests(2))
    assert [r.id for r in resume(out, requests(2), force=True).pending] == ["item-1"]


def test_finish_counts_by_kind_and_writes_the_quarantine(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    corrupt = {"stage": "decode", "kind": "corrupt", "message": "truncated"}
    empty = {"stage": "load", "kind": "empty", "message": "empty file (0 bytes)"}
    write_rows(out, [row("item-0", corrupt), row("item-1"), row("item-2", empty)])
    tally = count_output(read_rows(out), FLAT, ids(3), OutputPaths(out).quarantine)
    assert (tally.ok, tally.failed) == (1, 2)
    assert tally.failed_by_kind == {"corrupt": 1, "empty": 1}
    assert tally.failed_by_stage == {"decode": 1, "load": 1}
    assert tally.quarantine == OutputPaths(out).quarantine == tmp_path / "o.jsonl.quarantine.jsonl"
    quarantined = [json.loads(line) for line in tally.quarantine.read_text().splitlines()]
    assert quarantined == [
        {"id": "item-0", "source": "/data/item-0.jpg", **corrupt},
        {"id": "item-2", "source": "/data/item-2.jpg", **empty},
    ]
    # Once the failures are retried away, the stale quarantine goes too.
    write_rows(out, [row("item-0"), row("item-1"), row("item-2")])
    assert (
        count_output(read_rows(out), FLAT, ids(3), OutputPaths(out).quarantine).quarantine is None
    )
    assert not OutputPaths(out).quarantine.exists()


def test_jsonl_sink_starts_afresh_unless_appending(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    with JsonlSink(out) as sink:
        sink.write(row("a"))
    with JsonlSink(out, append=True) as sink:
        sink.write(row("b"))
        sink.flush()
        assert [r["id"] for r in read_rows(out)] == ["a", "b"]  # on disk before close
    with JsonlSink(out) as sink:
        sink.write(row("c"))
    assert [r["id"] for r in read_rows(out)] == ["c"]
    with pytest.raises(ValueError, match="closed"):
        sink.write(row("d"))


@pytest.mark.parametrize(
    "content",
    [
        # Not JSON lines at all, its last line without a newline.
        b"name,price\n" + b"widget,3\n" * 300 + b"gadget,4",
        # A manifest whose lines have an "id" (the old first-line check took it for a row).
        b"".join(json.dumps({"id": f"a{i}", "path": f"{i}.jpg"}).encode() + b"\n" for i in range(9))
        + b'{"id": "last", "path": "cut-off',
        # One row of an output, then someone else's lines, torn-looking at the end.
        json.dumps(row("item-0")).encode()
        + b"\n"
        + b'{"id": "x", "note": "mine"}\n' * 50
        + b'{"id": "y", "no',
    ],
    ids=["csv", "manifest", "row-then-other-lines"],
)
def test_force_never_touches_a_file_that_is_not_all_rows(
    tmp_path: Path, samples: Path, content: bytes
) -> None:
    from fake_cli import main
    from fake_engine import FakeEngine

    from mmbatch.cli import EXIT_JOB_FAILED

    out = tmp_path / "theirs.jsonl"
    out.write_bytes(content)
    OutputPaths(out).record.write_text(  # even beside a job record copied from elsewhere
        json.dumps({"version": 1, "digest": "x", "fingerprint": {}})
    )
    argv = ["caption", str(samples / "sunset.jpg"), "--model", "fake", "--out", str(out)]
    for extra in ([], ["--force"], ["--force", "--retry-errors"]):
        assert main([*argv, "--no-progress", *extra], FakeEngine()) == EXIT_JOB_FAILED
        assert out.read_bytes() == content
