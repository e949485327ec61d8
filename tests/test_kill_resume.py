"""SIGKILL a job (and its engine process) at many moments, resume each time, and check
the output holds every input exactly once, in input order, with the text an uninterrupted
run gives, and that no process of a killed job is left two seconds later.

The kills run the real command (sources, loader, pipeline, resumable sink) in a subprocess
with fake engines, each in an engine process of its own with a child standing in for vLLM's
engine core, as the real command runs vLLM, so that they cost seconds, not engine starts.
They land at moments drawn from a fixed seed (start-up, mid-job, between steps, writing;
``tests/manual/test_kill_sweep.py`` draws fifty at a random seed), half-way through
writing a row (the torn write a kill during ``write`` can leave), on the engine process
alone (the job starts another, and the dead one's engine core must go at once), and around
the final reordering of the rows. ``test_end_to_end.py`` kills the real vLLM command a few
times the same way, and ``test_engine_processes.py`` kills it while vLLM's own engine core
and worker processes start.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import fake_cli
import pytest
from media_files import cfr_video
from PIL import Image
from processes import alive, children, group_leaders, in_session, left_after
from repo_paths import FAKE_CLI

ITEMS = 40
STEP_SECONDS = "0.04"
ENGINE = {"FAKE_REPLICAS": "1", "FAKE_ENGINE_CORE": "1"}
"""A fake engine in an engine process of its own, with a child as vLLM has its engine core."""
GONE_WITHIN = 2.0
"""Seconds after a kill by which nothing the killed process started may be left."""


def make_inputs(folder: Path, items: int = ITEMS) -> int:
    """``items`` small distinct pictures, two of them broken; returns the number of files."""
    folder.mkdir()
    for i in range(items - 2):
        Image.new("RGB", (16, 16), (i * 6 % 256, 255 - i * 6 % 256, (i * 37) % 256)).save(
            folder / f"{i:03d}.png"
        )
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    (folder / "empty.jpg").write_bytes(b"")
    return items


def start(inputs: Path, out: Path, *options: str, **env: str) -> subprocess.Popen[bytes]:
    return start_command(["caption", str(inputs), *options], out, **env)


def start_command(command: list[str], out: Path, **env: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(FAKE_CLI), *command, "--model", "fake"]
    argv += ["--out", str(out), "--no-progress"]
    return subprocess.Popen(
        argv,
        env=os.environ | {"FAKE_STEP_SECONDS": STEP_SECONDS, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # what it starts stays in its session: found after a kill
    )


def timed_run(inputs: Path, out: Path, **env: str) -> tuple[float, float]:
    """Run the job uninterrupted; return the seconds until its first row and after it."""
    began = time.monotonic()
    job = start(inputs, out, **env)
    first_row = None
    while job.poll() is None:
        if first_row is None and out.exists() and out.stat().st_size:
            first_row = time.monotonic()
        time.sleep(0.005)
    assert job.returncode == 1, job.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    end = time.monotonic()
    first_row = first_row or end
    return first_row - began, end - first_row


def kill_after(job: subprocess.Popen[bytes], seconds: float) -> None:
    try:
        job.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)


def whole_rows(out: Path) -> list[dict[str, object]]:
    """The rows a reader trusts after a kill: every line but a torn (newline-less) tail."""
    if not out.exists():
        return []
    data = out.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines()]


def comparable(rows: list[dict[str, object]]) -> dict[object, tuple[object, ...]]:
    return {r["id"]: (r["media_hash"], r["text"], r["error"]) for r in rows}


def wait_for_row_after(job: subprocess.Popen[bytes], out: Path, count: int) -> bool:
    """Wait until ``out`` holds more than ``count`` rows; False if the job ended first."""
    while len(whole_rows(out)) <= count:
        if job.poll() is not None:
            return False
        time.sleep(0.005)
    return True


def kill_engine(job: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the job's engine process (the child that leads a process group of its own),
    and check that its engine core is gone with it within ``GONE_WITHIN``; False if the job
    had none to kill (it had ended)."""
    replicas = group_leaders(children(job.pid))
    if not replicas or job.poll() is not None:
        return False
    (replica,) = replicas
    core = children(replica)
    os.kill(replica, signal.SIGKILL)
    left = left_after(lambda: [pid for pid in (replica, *core) if alive(pid)], GONE_WITHIN)
    assert not left, f"the killed engine process left {left}"
    return True


MOMENTS = ("tear", "start-up", "mid-job", "engine", "start-up", "mid-job", "engine", "engine",
           "before-order", "during-order")  # fmt: skip
"""One cycle's kills of one output, in order; a clean run then finishes it."""


def kill_cycles(tmp_path: Path, cycles: int, seed: int) -> tuple[int, int, int, int]:
    """``cycles`` outputs, each killed at every moment of ``MOMENTS`` (the timings drawn from
    ``seed``), then finished by a clean run that must write the uninterrupted run's rows in
    input order. Returns the kills of the job, of its engine, the torn tails they left and
    the kills that landed mid-job."""
    inputs = tmp_path / "in"
    total = make_inputs(inputs)
    reference_out = tmp_path / "reference.jsonl"
    startup, _ = timed_run(inputs, reference_out, **ENGINE)
    reference = whole_rows(reference_out)
    expected = comparable(reference)
    assert len(expected) == total
    input_order = [row["id"] for row in reference]  # an uninterrupted run's output is ordered

    rng = random.Random(seed)
    kills = engine_kills = torn_tails = killed_mid_job = 0
    # Each cycle kills one output over and over, then a clean run finishes it; the odd cycles
    # decode in worker processes, which must go with a killed job too.
    for cycle in range(cycles):
        out = tmp_path / f"out-{cycle}.jsonl"
        workers = ("--decode-workers", str(cycle % 2))
        for moment in MOMENTS:
            before = len(whole_rows(out))
            where = f"cycle {cycle}, {moment}, seed {seed}"
            if moment == "tear":  # killed by itself half-way through writing one of its rows
                job = start(
                    inputs, out, *workers, **ENGINE, FAKE_TEAR_AT_ROW=str(rng.randint(1, 3))
                )
                job.wait(timeout=120)
            elif moment == "start-up":  # imports, listing, repair, the engine loading
                job = start(inputs, out, *workers, **ENGINE, FAKE_START_SECONDS="30")
                kill_after(job, rng.uniform(0, startup))
            elif moment.endswith("order"):  # its rows written, before or while it orders them
                kill_at = moment.removesuffix("-order")
                job = start(inputs, out, *workers, **ENGINE, FAKE_KILL_AT_ORDER=kill_at)
                job.wait(timeout=120)
            else:  # once this run has written a row, within the next few rows
                job = start(inputs, out, *workers, **ENGINE)
                if wait_for_row_after(job, out, before) and moment == "engine":
                    engine_kills += kill_engine(job)
                    wait_for_row_after(job, out, len(whole_rows(out)))  # its new engine works
                kill_after(job, rng.uniform(0, 6 * float(STEP_SECONDS)))
            job.stderr.close()  # type: ignore[union-attr]
            if job.returncode == -signal.SIGKILL:
                kills += 1
                left = left_after(partial(in_session, job.pid), GONE_WITHIN)
                assert not left, f"{where}: the killed job left {left}"
            rows = whole_rows(out)
            ids = [r["id"] for r in rows]
            assert len(ids) == len(set(ids)), f"a duplicate row after {where}"
            assert len(rows) >= before, f"rows were lost in {where}"
            for row in rows:
                assert comparable([row]) == {row["id"]: expected[row["id"]]}, where
            if job.returncode == -signal.SIGKILL:
                torn_tails += out.exists() and not out.read_bytes().endswith(b"\n")
                killed_mid_job += before < len(rows) < total

        final = start(inputs, out, *workers, **ENGINE)
        assert final.wait(timeout=120) == 1, final.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        final.stderr.close()  # type: ignore[union-attr]
        rows = whole_rows(out)
        assert out.read_bytes().endswith(b"\n")
        assert [row["id"] for row in rows] == input_order, f"cycle {cycle}, seed {seed}"
        assert comparable(rows) == expected, f"cycle {cycle}, seed {seed}"
        assert not list(tmp_path.glob(f".{out.name}*")), "a killed rewrite's file was left"
        quarantine = Path(f"{out}.quarantine.jsonl").read_text().splitlines()
        failed = sorted(Path(json.loads(q)["id"]).name for q in quarantine)
        assert failed == ["broken.jpg", "empty.jpg"]
    print("STATS", kills, engine_kills, torn_tails, killed_mid_job)
    return kills, engine_kills, torn_tails, killed_mid_job


def test_kills_at_every_moment_of_the_job_and_its_engine_lose_nothing_and_end_in_input_order(
    tmp_path: Path,
) -> None:
    """Two cycles of kills at a fixed seed (twenty kills), each cycle's landing in
    start-up, mid-job, on the engine alone, half-way through a row and around the final
    reordering; the first decodes in the job's process, the second in decode workers.
    ``tests/manual/test_kill_sweep.py`` runs fifty at a random seed."""
    seed = 11
    kills, engine_kills, torn_tails, killed_mid_job = kill_cycles(tmp_path, 2, seed)
    # The kills did land: on the job and on its engine, inside the work, not only around it.
    assert kills + engine_kills >= 20, f"seed {seed}: {kills} + {engine_kills} kills"
    assert engine_kills >= 4, f"seed {seed}: only {engine_kills} engine kills"
    assert torn_tails >= 2, f"seed {seed}"
    assert killed_mid_job >= 4, f"seed {seed}: only {killed_mid_job} kills landed mid-job"


def test_a_job_killed_before_it_orders_its_rows_ends_in_input_order_when_run_again(
    tmp_path: Path,
) -> None:
    """Killed between its last row and the rewrite in input order, a job leaves its rows in
    the order they finished; run again, with nothing left to do, it puts them in order."""
    inputs = tmp_path / "in"
    make_inputs(inputs, items=12)
    reference = tmp_path / "reference.jsonl"
    timed_run(inputs, reference)
    input_order = [row["id"] for row in whole_rows(reference)]

    out = tmp_path / "out.jsonl"
    job = start(inputs, out, FAKE_KILL_AT_ORDER="before")
    assert job.wait(timeout=60) == -signal.SIGKILL
    job.stderr.close()  # type: ignore[union-attr]
    finished = [row["id"] for row in whole_rows(out)]
    assert sorted(finished) == sorted(input_order)
    assert finished != input_order  # the fake engine finishes newest first

    again = start(inputs, out)
    assert again.wait(timeout=60) == 1
    stderr = again.stderr.read().decode()  # type: ignore[union-attr]
    again.stderr.close()  # type: ignore[union-attr]
    assert "0 items to do" in stderr
    assert [row["id"] for row in whole_rows(out)] == input_order


def openai_batch_file(folder: Path) -> Path:
    """A batch of 30 lines: 28 over the pictures of ``make_inputs`` (two of them broken),
    one line refused as it is read (n = 2), one text-only line."""
    make_inputs(folder)
    lines = []
    for picture in sorted(folder.iterdir()):
        content = [{"type": "image_url", "image_url": {"url": picture.name}}, "What is it?"]
        lines.append(batch_line(f"req-{picture.stem}", content))
    lines = lines[:28]
    lines.append(batch_line("refused", ["hi"], n=2))
    lines.append(batch_line("text-only", ["Just text."]))
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def batch_line(custom_id: str, content: list[object], **body: object) -> dict[str, object]:
    parts = [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]
    messages = [{"role": "user", "content": parts}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": messages, "max_tokens": 8, **body},
    }


def check_killed_and_rerun(tmp_path: Path, command: str, rounds: int, seed: int) -> None:
    """``command`` killed ``rounds`` times once it has written a row (the timings drawn from
    ``seed``), then run to its end: every input has exactly one row, the row an
    uninterrupted run writes. The uninterrupted run and the last one run the same command in
    this process (each process of ``run-openai-batch`` imports vLLM's request models)."""
    if command == "frames":
        videos = tmp_path / "videos"
        videos.mkdir()
        for n in range(3):
            cfr_video(videos / f"v{n}.mp4", frames=40, fps=10)
        args = ["frames", str(videos), "--fps", "4"]
        key = "id"
    else:
        args = ["run-openai-batch", str(openai_batch_file(tmp_path / "batch"))]
        key = "custom_id"

    def rows_of(out: Path) -> dict[object, dict[str, object]]:
        rows = whole_rows(out)
        by_id = {row[key]: row for row in rows}
        assert len(by_id) == len(rows), "an input has two rows"
        return by_id

    def run_here(out: Path) -> int:
        return fake_cli.main([*args, "--model", "fake", "--out", str(out), "--no-progress"])

    reference = tmp_path / "reference.jsonl"
    assert run_here(reference) in (0, 1)
    expected = rows_of(reference)
    assert len(expected) == (30 if command == "run-openai-batch" else 3 * 16)

    rng = random.Random(seed)
    out = tmp_path / "out.jsonl"
    killed_mid_job = 0
    for round_no in range(rounds):
        before = len(whole_rows(out))
        job = start_command(args, out)
        while job.poll() is None and len(whole_rows(out)) <= before:
            time.sleep(0.005)
        kill_after(job, rng.uniform(0, 8 * float(STEP_SECONDS)))
        job.stderr.close()  # type: ignore[union-attr]
        rows = rows_of(out)
        assert len(rows) >= before, f"rows were lost in round {round_no}, seed {seed}"
        killed_mid_job += job.returncode == -signal.SIGKILL and len(rows) < len(expected)
    assert run_here(out) == job_code(expected)
    rows = rows_of(out)
    assert sorted(rows) == sorted(expected), f"seed {seed}"
    for item_id, row in rows.items():
        assert stable(row) == stable(expected[item_id]), (item_id, seed)
    assert killed_mid_job >= 2, f"seed {seed}: only {killed_mid_job} kills landed mid-job"


@pytest.mark.parametrize(("command", "rounds"), [("frames", 6), ("run-openai-batch", 3)])
def test_frames_and_batch_files_killed_and_rerun_end_with_every_row_once(
    tmp_path: Path, command: str, rounds: int
) -> None:
    """``mmbatch frames`` and ``mmbatch run-openai-batch`` resume like ``caption``: killed
    at fixed-seed moments and run again, every input ends with exactly one row, the row an
    uninterrupted run writes (``tests/manual/test_kill_sweep.py``: six kills of each at a
    random seed)."""
    check_killed_and_rerun(tmp_path, command, rounds, seed=7)


def job_code(rows: dict[object, dict[str, object]]) -> int:
    """The exit code of a finished job: 1 when any row is an error (or a non-200 line)."""
    for row in rows.values():
        response = row.get("response")
        status = response.get("status_code") if isinstance(response, dict) else 200
        if row.get("error") is not None or status != 200:
            return 1
    return 0


def stable(row: dict[str, object]) -> object:
    """What must not change between runs (a chat.completion's ``created`` time does)."""
    response = row.get("response")
    if isinstance(response, dict):
        body = dict(response["body"])
        body.pop("created", None)
        return {**row, "response": {**response, "body": body}}
    return row
