"""SIGKILL a caption job at 20 random moments, resume each time, and check the output holds
every input exactly once with the text an uninterrupted run gives.

The 20 kills run the real command (sources, loader, pipeline, resumable sink) in a
subprocess with the fake engine, so that they cost seconds, not 20 engine starts: most land
at a random time (start-up, loading, mid-window, between steps, writing), and four make the
process kill itself half-way through writing a row, the torn write a kill during ``write``
can leave. ``test_end_to_end.py`` kills the real vLLM command a few times the same way.
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

from PIL import Image

FAKE_CLI = Path(__file__).resolve().parent / "fake_cli.py"
ITEMS = 40
STEP_SECONDS = "0.04"


def make_inputs(folder: Path) -> int:
    """``ITEMS`` small distinct pictures, two of them broken; returns the number of files."""
    folder.mkdir()
    for i in range(ITEMS - 2):
        Image.new("RGB", (16, 16), (i * 6, 255 - i * 6, (i * 37) % 256)).save(
            folder / f"{i:02d}.png"
        )
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    (folder / "empty.jpg").write_bytes(b"")
    return ITEMS


def start(inputs: Path, out: Path, **env: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(FAKE_CLI), "caption", str(inputs), "--model", "fake"]
    argv += ["--out", str(out), "--no-progress", "--window", "6"]
    return subprocess.Popen(
        argv,
        env=os.environ | {"FAKE_STEP_SECONDS": STEP_SECONDS, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def timed_run(inputs: Path, out: Path) -> tuple[float, float]:
    """Run the job uninterrupted; return the seconds until its first row and after it."""
    began = time.monotonic()
    job = start(inputs, out)
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


def test_twenty_kills_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    total = make_inputs(inputs)
    reference_out = tmp_path / "reference.jsonl"
    startup, _ = timed_run(inputs, reference_out)
    expected = comparable(whole_rows(reference_out))
    assert len(expected) == total

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    out = tmp_path / "out.jsonl"
    torn_tails = killed_mid_job = tear_rounds = 0
    for round_no in range(20):
        before = len(whole_rows(out))
        phase = round_no % 5
        if phase == 0 and before < total - 3:
            # Killed by itself half-way through writing one of its first rows.
            job = start(inputs, out, FAKE_TEAR_AT_ROW=str(rng.randint(1, 3)))
            job.wait(timeout=120)
            tear_rounds += 1
        elif phase in (1, 3):
            # Any moment of start-up: imports, listing, repair, the first window's decode.
            job = start(inputs, out)
            kill_after(job, rng.uniform(0, startup))
        else:
            # In the work: once this run has written a row, within the next few rows.
            job = start(inputs, out)
            while job.poll() is None and len(whole_rows(out)) <= before:
                time.sleep(0.005)
            kill_after(job, rng.uniform(0, 6 * float(STEP_SECONDS)))
        job.stderr.close()  # type: ignore[union-attr]
        rows = whole_rows(out)
        ids = [r["id"] for r in rows]
        where = f"round {round_no}, seed {seed}"
        assert len(ids) == len(set(ids)), f"a duplicate row after {where}"
        assert len(rows) >= before, f"rows were lost in {where}"
        for row in rows:
            assert comparable([row]) == {row["id"]: expected[row["id"]]}, where
        if job.returncode == -signal.SIGKILL:
            torn_tails += out.exists() and not out.read_bytes().endswith(b"\n")
            killed_mid_job += before < len(rows) < total

    final = start(inputs, out)
    assert final.wait(timeout=120) == 1, final.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    final.stderr.close()  # type: ignore[union-attr]
    rows = whole_rows(out)
    assert out.read_bytes().endswith(b"\n")
    assert len(rows) == total, f"seed {seed}"
    assert comparable(rows) == expected, f"seed {seed}"
    quarantine = (tmp_path / "out.jsonl.quarantine.jsonl").read_text().splitlines()
    assert sorted(Path(json.loads(q)["id"]).name for q in quarantine) == ["broken.jpg", "empty.jpg"]
    # The kills did land inside the work, not only before or after it.
    assert torn_tails >= tear_rounds >= 2, f"seed {seed}"
    assert killed_mid_job >= 4, f"seed {seed}: only {killed_mid_job} kills landed mid-job"
