"""SIGKILL a job whose inputs and output are in object storage, at random moments, resume it
each time, and check that the store never holds a row twice nor loses one it held, and that
the finished output holds every input exactly once, in input order, with the rows of an
uninterrupted run.

The job is the real command (sources, loader, pipeline, the output's commit) in a
subprocess with the fake engine (``tests/fake_cli.py``), against the tests' S3 server, so a
kill costs a second or two. Kills land at times drawn from a fixed seed (start-up, reading,
writing parts, assembling) and just before one of the output's writes and deletes, drawn alike
(``FAKE_KILL_AT_STORAGE_WRITE``): between a part and the next, between the assembly and its
marker, half-way through clearing the parts, before the summary.

Chance alone reaches a given write about once in thirty kills, so the commit's order is also
swept without it: a run resuming a killed job is killed before each of its writes in turn,
each from the same state (``test_a_resumed_job_killed_before_each_...``).

What the store holds after each kill is read here by the rule ``mmbatch.output.remote``
states, written out again (``truth``), not by mmbatch's own reader: the marker there, the
assembled output; else the parts in sequence order (a row whose id is already held, with no
drop between, is a duplicate and fails the test); else the output, if any.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from repo_paths import FAKE_CLI
from s3_server import Bucket
from test_kill_resume import make_inputs

KILLS = 20


def start(inputs: str, out: str, **env: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(FAKE_CLI), "caption", inputs, "--model", "fake"]
    argv += ["--out", out, "--no-progress"]
    return subprocess.Popen(
        argv,
        env=os.environ | {"FAKE_STEP_SECONDS": "0.02", "FAKE_PART_ROWS": "3", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def finish(job: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str]:
    try:
        code = job.wait(timeout=timeout)
    finally:
        err = job.stderr.read().decode() if job.stderr else ""  # type: ignore[union-attr]
        if job.stderr:
            job.stderr.close()
    return code, err


def rows_in(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def truth(s3: Bucket, key: str) -> list[dict[str, Any]]:
    """The rows the store holds for the output ``key`` (see the module's docstring)."""
    parts = [k.rsplit("/", 1)[1] for k in s3.keys(f"{key}.parts")]
    if "assembled.json" in parts or not any(p[:8].isdigit() for p in parts):
        return rows_in(s3.get(key)) if key in s3.keys(key) else []
    held: dict[str, dict[str, Any]] = {}
    for part in sorted(p for p in parts if p[:8].isdigit()):
        data = s3.get(f"{key}.parts/{part}")
        if part.endswith(".drop.json"):
            for item_id in json.loads(data)["ids"]:
                held.pop(item_id, None)
            continue
        for row in rows_in(data):
            assert row["id"] not in held, f"{row['id']} written twice (in {part})"
            held[row["id"]] = row
    return list(held.values())


def comparable(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["media_hash"], row["text"], row["error"])


def check_kept(
    s3: Bucket,
    key: str,
    before: list[dict[str, Any]],
    expected: dict[str, tuple[Any, ...]],
    where: str,
) -> list[dict[str, Any]]:
    """The rows the output ``key`` holds after a run ended as ``where`` says: none twice,
    every row of ``before`` still there, each the row an uninterrupted run writes."""
    after = truth(s3, key)
    ids = [row["id"] for row in after]
    assert len(ids) == len(set(ids)), f"a row held twice after {where}"
    assert {row["id"] for row in before} <= set(ids), f"rows were lost in {where}"
    for row in after:
        assert comparable(row) == expected[row["id"]], where
    return after


def check_finished(s3: Bucket, key: str, reference: list[dict[str, Any]], seed: int) -> None:
    """The output ``key`` of a run that ended by itself: every input once, in input order,
    the rows of an uninterrupted run, the parts cleared, the quarantine beside it."""
    rows = rows_in(s3.get(key))
    assert [row["id"] for row in rows] == [row["id"] for row in reference], f"seed {seed}"
    assert [comparable(r) for r in rows] == [comparable(r) for r in reference], f"seed {seed}"
    assert not s3.keys(f"{key}.parts"), f"the parts outlived the assembly (seed {seed})"
    failed = sorted(Path(row["id"]).name for row in rows_in(s3.get(f"{key}.quarantine.jsonl")))
    assert failed == ["broken.jpg", "empty.jpg"]


def test_random_kills_of_a_job_in_storage_lose_nothing_and_duplicate_nothing(
    s3: Bucket, tmp_path: Path
) -> None:
    total = make_inputs(tmp_path / "in", items=30)
    inputs = s3.upload(tmp_path / "in", "in")
    began = time.monotonic()
    code, err = finish(start(inputs, s3.url("reference.jsonl")))
    uninterrupted = time.monotonic() - began
    assert code == 1, err[-2000:]
    reference = rows_in(s3.get("reference.jsonl"))
    expected = {row["id"]: comparable(row) for row in reference}
    assert len(expected) == total

    seed = 11  # a fixed seed: what the kills are is not a draw of the run
    rng = random.Random(seed)
    kills = mid_job = at_writes = finished = 0
    out = "rows/out-0.jsonl"
    for attempt in range(4 * KILLS):
        if kills >= KILLS:
            break
        before = truth(s3, out)
        where = f"attempt {attempt} on {out}, seed {seed}"
        if attempt % 2:
            write = str(rng.randint(1, 30))
            code, err = finish(start(inputs, s3.url(out), FAKE_KILL_AT_STORAGE_WRITE=write))
            at_writes += code == -signal.SIGKILL
        else:
            job = start(inputs, s3.url(out))
            try:
                job.wait(timeout=rng.uniform(0.2, uninterrupted))
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
            code, err = finish(job)
        assert code in (-signal.SIGKILL, 1), f"{where}: exit {code}\n{err[-2000:]}"
        after = check_kept(s3, out, before, expected, where)
        if code == -signal.SIGKILL:
            kills += 1
            mid_job += len(after) < total
        else:  # it ran to its end: the output is whole; the kills go on with another
            check_finished(s3, out, reference, seed)
            finished += 1
            out = f"rows/out-{finished}.jsonl"
    code, err = finish(start(inputs, s3.url(out)))
    assert code == 1, err[-2000:]
    check_finished(s3, out, reference, seed)
    print(f"STATS kills={kills} at_writes={at_writes} mid_job={mid_job} outputs={finished + 1}")
    assert kills >= KILLS, f"seed {seed}: only {kills} kills landed"
    assert at_writes >= KILLS // 4, f"seed {seed}: only {at_writes} kills at a write"
    assert mid_job >= KILLS // 4, f"seed {seed}: only {mid_job} kills with rows still to do"


def copy_output(s3: Bucket, key: str, to: str) -> None:
    """Every object of the output ``key`` (its parts, record, summary...) as the output
    ``to``: the same state, for another run to start from."""
    for held in (k for k in s3.keys(prefix="") if k.startswith(key)):
        s3.fs.copy(f"{s3.name}/{held}", f"{s3.name}/{to}{held[len(key) :]}")


def test_a_resumed_job_killed_before_each_of_its_store_writes_in_turn_loses_and_repeats_nothing(
    s3: Bucket, tmp_path: Path
) -> None:
    """The sweep without chance: a job killed part-way leaves its parts; a run resuming it
    is killed just before its first write or delete in the store, then (from the same
    state) before its second, and so on until a run reaches its end. After each kill the
    store holds every row it held before, none twice; a run after it finishes the output
    with every input once."""
    total = make_inputs(tmp_path / "in", items=8)
    inputs = s3.upload(tmp_path / "in", "in")
    code, err = finish(start(inputs, s3.url("reference.jsonl"), FAKE_PART_ROWS="2"))
    assert code == 1, err[-2000:]
    reference = rows_in(s3.get("reference.jsonl"))
    expected = {row["id"]: comparable(row) for row in reference}
    assert len(expected) == total

    killed_at = {"FAKE_PART_ROWS": "2", "FAKE_KILL_AT_STORAGE_WRITE": "5"}
    code, err = finish(start(inputs, s3.url("left.jsonl"), **killed_at))
    assert code == -signal.SIGKILL, err[-2000:]
    left = truth(s3, "left.jsonl")
    assert 0 < len(left) < total, "the first run left no part, or finished"

    write = 0
    while True:
        write += 1
        assert write < 60, "a run that never ends"
        out = f"rows/out-{write}.jsonl"
        copy_output(s3, "left.jsonl", out)
        env = {"FAKE_PART_ROWS": "2", "FAKE_KILL_AT_STORAGE_WRITE": str(write)}
        code, err = finish(start(inputs, s3.url(out), **env))
        where = f"the resumed run killed before its store write {write}"
        assert code in (-signal.SIGKILL, 1), f"{where}: exit {code}\n{err[-2000:]}"
        check_kept(s3, out, left, expected, where)
        if code == 1:  # no write left to kill it before
            check_finished(s3, out, reference, write)
            break
        code, err = finish(start(inputs, s3.url(out), FAKE_PART_ROWS="2"))
        assert code == 1, f"the run after {where}: exit {code}\n{err[-2000:]}"
        check_finished(s3, out, reference, write)
    print(f"STATS resumed run killed before each of {write - 1} store writes")
    assert write > 8, f"only {write - 1} writes swept"
