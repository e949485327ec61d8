"""Ctrl-C at any moment of a job: it stops within seconds with exit code 130, every row it
wrote is whole and kept, no engine process outlives it, and the same command resumes it to
exactly the output an uninterrupted run gives.

(A shell reports 130 for a process that SIGINT ended too: that is Python's own exit when
Ctrl-C comes while it is still importing the command, before the command can catch it.)
Ctrl-C in a terminal sends SIGINT to the job's whole process group; these tests do the same
(``os.killpg`` on a job started in a session of its own). The ten random moments run the
real command with fake engines in replica processes, as the real command runs vLLM, so that
they cost seconds; ``test_end_to_end.py`` interrupts the command on vLLM itself.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from test_kill_resume import FAKE_CLI, STEP_SECONDS, comparable, make_inputs, whole_rows

from mmbatch.cli import EXIT_INTERRUPTED, EXIT_ITEMS_FAILED, EXIT_TERMINATED


def start(inputs: Path, out: Path, mark: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(FAKE_CLI), "caption", str(inputs), "--model", "fake"]
    argv += ["--out", str(out), "--no-progress"]
    env = os.environ | {"FAKE_STEP_SECONDS": STEP_SECONDS, "FAKE_REPLICAS": "2"}
    return subprocess.Popen(
        argv,
        env=env | {"MMBATCH_TEST_MARK": mark},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
    )


def processes_marked(mark: str) -> list[int]:
    """The processes whose environment holds ``mark`` (the job and whatever it started)."""
    found = []
    needle = f"MMBATCH_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone, or not ours to read
    return found


def assert_none_left(mark: str) -> None:
    deadline = time.monotonic() + 10
    while processes_marked(mark):
        assert time.monotonic() < deadline, (
            f"processes left after the job: {processes_marked(mark)}"
        )
        time.sleep(0.1)


def first_row_after(job: subprocess.Popen[bytes], out: Path) -> float:
    """When ``out`` got its first row (or the job ended)."""
    while job.poll() is None and not (out.exists() and out.stat().st_size):
        time.sleep(0.005)
    return time.monotonic()


def test_ctrl_c_at_ten_random_moments_exits_130_and_resumes_exactly(tmp_path: Path) -> None:
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

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    interrupted = mid_job = 0
    for round_no in range(10):
        where = f"round {round_no}, seed {seed}"
        out = tmp_path / f"out-{round_no}.jsonl"
        job = start(inputs, out, mark)
        if round_no % 2:
            first_row_after(job, out)  # in the work: within the next few rows
            time.sleep(rng.uniform(0, 6 * float(STEP_SECONDS)))
        else:
            time.sleep(rng.uniform(0, startup))  # imports, listing, replicas starting
        os.killpg(job.pid, signal.SIGINT)
        try:
            code = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(job.pid, signal.SIGUSR1)  # fake_cli dumps every thread's stack
            time.sleep(1)
            for pid in processes_marked(mark):
                os.kill(pid, signal.SIGKILL)
            stacks = job.communicate()[1].decode()
            raise AssertionError(f"the job hung after Ctrl-C in {where}:\n{stacks}") from None
        stderr = job.stderr.read().decode()  # type: ignore[union-attr]
        job.stderr.close()  # type: ignore[union-attr]
        assert_none_left(mark)
        if code == EXIT_ITEMS_FAILED:
            continue  # the job had finished before the signal came
        if code != -signal.SIGINT:
            assert code == EXIT_INTERRUPTED, f"{where}: exit {code}\n{stderr[-2000:]}"
            assert "Traceback" not in stderr, f"{where}\n{stderr[-2000:]}"
            assert "run the same command again to resume" in stderr.splitlines()[-1], where
        # else: Ctrl-C while Python was still importing the command, before it could take the
        # signal: Python ends itself by SIGINT, which a shell also reports as 130.
        interrupted += 1
        rows = whole_rows(out)
        if out.exists() and out.stat().st_size:
            assert out.read_bytes().endswith(b"\n"), f"a torn row after {where}"
        for row in rows:
            assert comparable([row]) == {row["id"]: expected[row["id"]]}, where
        mid_job += 0 < len(rows) < total

        resumed = start(inputs, out, mark)
        assert resumed.wait(timeout=120) == EXIT_ITEMS_FAILED, where
        resumed.stderr.close()  # type: ignore[union-attr]
        rows = whole_rows(out)
        assert len(rows) == total, f"{where}: {len(rows)} rows after the resume"
        assert comparable(rows) == expected, where
    assert_none_left(mark)
    assert interrupted >= 5, f"seed {seed}: only {interrupted} signals landed before the end"
    assert mid_job >= 2, f"seed {seed}: only {mid_job} signals landed mid-job"


def is_resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker, which exits only once it sees its parent gone."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # gone meanwhile


def test_sigterm_to_the_job_alone_stops_it_as_ctrl_c_does(tmp_path: Path) -> None:
    """``timeout``, a batch scheduler or ``kill`` sends SIGTERM to the job's process alone:
    it exits 143 with the rows it finished kept, its engine processes already stopped (a
    resumed job must find the GPU free), and the same command resumes it exactly."""
    inputs = tmp_path / "in"
    total = make_inputs(inputs)
    mark = uuid.uuid4().hex
    reference = start(inputs, tmp_path / "reference.jsonl", mark)
    assert reference.wait(timeout=120) == EXIT_ITEMS_FAILED
    reference.stderr.close()  # type: ignore[union-attr]
    expected = comparable(whole_rows(tmp_path / "reference.jsonl"))

    out = tmp_path / "out.jsonl"
    job = start(inputs, out, mark)
    first_row_after(job, out)
    os.kill(job.pid, signal.SIGTERM)
    code = job.wait(timeout=60)
    left = [pid for pid in processes_marked(mark) if not is_resource_tracker(pid)]  # at once
    stderr = job.stderr.read().decode()  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    assert code == EXIT_TERMINATED, f"exit {code}\n{stderr[-2000:]}"
    assert "Traceback" not in stderr, stderr[-2000:]
    assert "run the same command again to resume" in stderr.splitlines()[-1]
    assert not left, f"processes outlived the job: {left}"
    assert_none_left(mark)  # multiprocessing's resource tracker too, once it sees the job gone
    rows = whole_rows(out)
    assert 0 < len(rows) < total
    assert out.read_bytes().endswith(b"\n")

    resumed = start(inputs, out, mark)
    assert resumed.wait(timeout=120) == EXIT_ITEMS_FAILED
    resumed.stderr.close()  # type: ignore[union-attr]
    assert comparable(whole_rows(out)) == expected
