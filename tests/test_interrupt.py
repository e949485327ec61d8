"""Ctrl-C or SIGTERM at any moment of a job: it stops within seconds with exit code 130 (143
for SIGTERM), every row it wrote is whole and kept, its engine processes are stopped before
it exits (a resumed job must find the GPU free) and nothing it started outlives it, and the
same command resumes it to exactly the output an uninterrupted run gives.

(A shell reports 130 for a process that SIGINT ended too: that is Python's own exit when
Ctrl-C comes while it is still importing the command, before the command can catch it.)
Ctrl-C in a terminal sends SIGINT to the job's whole process group; these tests do the same
(``os.killpg`` on a job started in a session of its own); ``timeout``, a batch scheduler or
``kill`` sends SIGTERM to the job's process alone. The random moments run the real command
with fake engines in engine processes, each with a child as vLLM's engine has its engine
core, so that they cost seconds; ``test_end_to_end.py`` interrupts the command on vLLM.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path

from processes import command, in_session, left_after, marked
from test_kill_resume import FAKE_CLI, STEP_SECONDS, comparable, make_inputs, whole_rows

from mmbatch.cli import EXIT_INTERRUPTED, EXIT_ITEMS_FAILED, EXIT_TERMINATED

STOPPED_WITHIN = 10.0
"""Seconds from the signal to the job's exit."""
ENGINE_LOADING = "120"
"""Seconds each fake engine takes to load in the start-up rounds: longer than any of them."""


def start(inputs: Path, out: Path, mark: str, **extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(FAKE_CLI), "caption", str(inputs), "--model", "fake"]
    argv += ["--out", str(out), "--no-progress"]
    env = os.environ | {"FAKE_STEP_SECONDS": STEP_SECONDS, "FAKE_REPLICAS": "2", **extra}
    return subprocess.Popen(
        argv,
        env=env | {"MMBATCH_TEST_MARK": mark, "FAKE_ENGINE_CORE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
    )


def assert_none_left(mark: str, session: int | None = None, seconds: float = 10) -> None:
    """Nothing the job started is left within ``seconds``: no process whose environment
    holds ``mark``, nor (a job started in a session of its own: its pid) in its session,
    which also finds the processes vLLM renames."""
    found = marked if session is None else lambda m: sorted({*marked(m), *in_session(session)})
    left = left_after(partial(found, mark), seconds)
    assert not left, f"processes left after the job: {left}"


def first_row_after(job: subprocess.Popen[bytes], out: Path, count: int = 0) -> float:
    """When ``out`` got more than ``count`` rows (or the job ended)."""
    while job.poll() is None and len(whole_rows(out)) <= count:
        time.sleep(0.005)
    return time.monotonic()


def stop(job: subprocess.Popen[bytes], how: signal.Signals, where: str) -> int:
    """Send ``how`` as a terminal (SIGINT, to the group) or a scheduler (SIGTERM, to the job
    alone) does; the exit code, within ``STOPPED_WITHIN`` (else the job's stacks fail it)."""
    if how == signal.SIGINT:
        os.killpg(job.pid, signal.SIGINT)
    else:
        os.kill(job.pid, signal.SIGTERM)
    try:
        return job.wait(timeout=STOPPED_WITHIN)
    except subprocess.TimeoutExpired:
        os.kill(job.pid, signal.SIGUSR1)  # fake_cli dumps every thread's stack
        time.sleep(1)
        for pid in in_session(job.pid):
            os.kill(pid, signal.SIGKILL)
        stacks = job.communicate()[1].decode()
        raise AssertionError(
            f"the job did not stop after {how.name} in {where}:\n{stacks}"
        ) from None


def ended_in_pythons_own_start(code: int, stderr: str) -> bool:
    """Whether Ctrl-C came while the interpreter was still starting itself (importing
    ``site`` and what the environment's ``.pth`` files import), before the first line of the
    command ran: Python then stops with a fatal error of its own and exit code 1, having
    run nothing of the command. (Seen under load, a tenth of a second into a job.)"""
    said = stderr.rstrip()
    return (
        code == 1
        and "Fatal Python error: init_import_site" in said
        and said.endswith("KeyboardInterrupt")
    )


def resource_trackers(session: int) -> set[int]:
    """multiprocessing's resource tracker in ``session``, which exits only once it sees the
    job gone (found while the job runs: as it exits, its command line is already empty)."""
    return {pid for pid in in_session(session) if "resource_tracker" in command(pid)}


def test_ctrl_c_at_random_moments_of_start_up_exits_130_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    inputs = tmp_path / "in"
    total = make_inputs(inputs)
    mark = uuid.uuid4().hex
    began = time.monotonic()
    reference = start(inputs, tmp_path / "reference.jsonl", mark)
    startup = first_row_after(reference, tmp_path / "reference.jsonl") - began
    assert reference.wait(timeout=120) == EXIT_ITEMS_FAILED, reference.stderr.read().decode()  # type: ignore[union-attr]
    reference.stderr.close()  # type: ignore[union-attr]
    expected = comparable(whole_rows(tmp_path / "reference.jsonl"))
    assert len(expected) == total

    seed = 3
    rng = random.Random(seed)
    for round_no in range(5):
        where = f"round {round_no}, seed {seed}"
        out = tmp_path / f"out-{round_no}.jsonl"
        # Its engines load for longer than the moment drawn can be (the reference's start-up,
        # timed on a machine whose load may have dropped since): the signal lands in start-up.
        job = start(inputs, out, mark, FAKE_START_SECONDS=ENGINE_LOADING)
        time.sleep(rng.uniform(0, startup))  # imports, listing, replicas starting
        code = stop(job, signal.SIGINT, where)
        stderr = job.stderr.read().decode()  # type: ignore[union-attr]
        job.stderr.close()  # type: ignore[union-attr]
        assert_none_left(mark, job.pid)
        if code != -signal.SIGINT and not ended_in_pythons_own_start(code, stderr):
            assert code == EXIT_INTERRUPTED, f"{where}: exit {code}\n{stderr[-2000:]}"
            assert "Traceback" not in stderr, f"{where}\n{stderr[-2000:]}"
            assert "run the same command again to resume" in stderr.splitlines()[-1], where
        # else: Ctrl-C while Python was still importing the command, before it could take the
        # signal: Python ends itself by SIGINT, which a shell also reports as 130; or still
        # starting itself (ended_in_pythons_own_start).
        if out.exists() and out.stat().st_size:
            assert out.read_bytes().endswith(b"\n"), f"a torn row after {where}"
        for row in whole_rows(out):
            assert comparable([row]) == {row["id"]: expected[row["id"]]}, where

        resumed = start(inputs, out, mark)
        assert resumed.wait(timeout=120) == EXIT_ITEMS_FAILED, where
        resumed.stderr.close()  # type: ignore[union-attr]
        assert comparable(whole_rows(out)) == expected, where
    assert_none_left(mark)


def check_stops_after_rows_started(tmp_path: Path, rounds: int, seed: int) -> None:
    """``rounds`` stops of one job, each once it has written a row (Ctrl-C and SIGTERM in
    turn, the moments drawn from ``seed``): each exits 130 or 143 within ten seconds, its
    engine processes already stopped when it exits and nothing it started left after; the
    rerun after the last ends with the output an uninterrupted run writes."""
    inputs = tmp_path / "in"
    total = make_inputs(inputs, items=200)
    mark = uuid.uuid4().hex
    reference = start(inputs, tmp_path / "reference.jsonl", mark)
    assert reference.wait(timeout=120) == EXIT_ITEMS_FAILED
    reference.stderr.close()  # type: ignore[union-attr]
    reference_rows = whole_rows(tmp_path / "reference.jsonl")
    expected = comparable(reference_rows)
    assert len(expected) == total

    rng = random.Random(seed)
    out = tmp_path / "out.jsonl"
    for round_no in range(rounds):
        how = (signal.SIGINT, signal.SIGTERM)[round_no % 2]
        where = f"round {round_no} ({how.name}), seed {seed}"
        before = len(whole_rows(out))
        job = start(inputs, out, mark)
        first_row_after(job, out, before)
        time.sleep(rng.uniform(0, 4 * float(STEP_SECONDS)))  # within the next few rows
        trackers = resource_trackers(job.pid)
        code = stop(job, how, where)
        engines = [f"{pid} {command(pid)}" for pid in in_session(job.pid) if pid not in trackers]
        stderr = job.stderr.read().decode()  # type: ignore[union-attr]
        job.stderr.close()  # type: ignore[union-attr]
        wanted = EXIT_INTERRUPTED if how == signal.SIGINT else EXIT_TERMINATED
        assert code == wanted, f"{where}: exit {code}\n{stderr[-2000:]}"
        assert "Traceback" not in stderr, f"{where}\n{stderr[-2000:]}"
        assert "run the same command again to resume" in stderr.splitlines()[-1], where
        assert not engines, f"{where}: processes outlived the job: {engines}"  # at once
        assert_none_left(mark, job.pid)  # the resource tracker too, once it sees them gone
        rows = whole_rows(out)
        assert before < len(rows) < total, where
        assert out.read_bytes().endswith(b"\n"), f"a torn row after {where}"
        assert len({row["id"] for row in rows}) == len(rows), where
        for row in rows:
            assert comparable([row]) == {row["id"]: expected[row["id"]]}, where

    resumed = start(inputs, out, mark)
    assert resumed.wait(timeout=120) == EXIT_ITEMS_FAILED
    resumed.stderr.close()  # type: ignore[union-attr]
    rows = whole_rows(out)
    assert [row["id"] for row in rows] == [row["id"] for row in reference_rows]
    assert comparable(rows) == expected
    assert_none_left(mark)


def test_sigint_and_sigterm_at_six_moments_after_rows_started_stop_the_job_in_seconds(
    tmp_path: Path,
) -> None:
    """Three Ctrl-Cs and three SIGTERMs at a fixed seed (``tests/manual``: twenty at a
    random seed)."""
    check_stops_after_rows_started(tmp_path, rounds=6, seed=5)


def test_ctrl_c_while_the_job_waits_for_the_engine_it_began_exits_130_at_once(
    tmp_path: Path,
) -> None:
    """Ctrl-C once the inputs are listed, while the job waits for the engine it began beside
    the listing (still loading) and its decode workers start: exit 130 within seconds and no
    traceback (the workers, in the terminal's process group, leave Ctrl-C to the job), the
    engine's processes and the workers gone as it exits, and the same command then runs
    the job to its end."""
    inputs = tmp_path / "in"
    total = make_inputs(inputs)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out, mark = tmp_path / "out.jsonl", uuid.uuid4().hex

    def begun_early(start_seconds: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, str(FAKE_CLI), "caption", str(inputs), "--model", str(model)]
        argv += ["--out", str(out), "--no-progress", "--decode-workers", "2"]
        env = {"FAKE_BEGUN_EARLY": "1", "FAKE_REPLICAS": "1", "FAKE_ENGINE_CORE": "1"}
        env |= {"FAKE_START_SECONDS": start_seconds, "FAKE_STEP_SECONDS": STEP_SECONDS}
        return subprocess.Popen(
            argv,
            env=os.environ | env | {"MMBATCH_TEST_MARK": mark},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    job = begun_early(start_seconds="120")
    # Waiting: the engine's replica (begun as the listing began) and both decode workers
    # (started as the job took its engine) are up, the engine not ready.
    deadline = time.monotonic() + 60
    while len([p for p in in_session(job.pid) if "spawn_main" in command(p)]) < 3:
        assert job.poll() is None, job.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    trackers = resource_trackers(job.pid)
    code = stop(job, signal.SIGINT, "the wait for the engine")
    engines = [f"{pid} {command(pid)}" for pid in in_session(job.pid) if pid not in trackers]
    stderr = job.stderr.read().decode()  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    assert code == EXIT_INTERRUPTED, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "run the same command again to resume" in stderr.splitlines()[-1]
    assert not engines, f"processes outlived the job: {engines}"
    assert_none_left(mark, job.pid)
    assert whole_rows(out) == []

    resumed = begun_early(start_seconds="0")
    assert resumed.wait(timeout=120) == EXIT_ITEMS_FAILED
    resumed.stderr.close()  # type: ignore[union-attr]
    assert len(whole_rows(out)) == total
    assert_none_left(mark)
