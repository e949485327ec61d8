"""SIGKILL a caption job at 20 random moments, resume each time, and check the output holds
every input exactly once with the text an uninterrupted run gives.

The 20 kills run the real command (sources, loader, pipeline, resumable sink) in a
subprocess with the fake engine, so that they cost seconds, not 20 engine starts: most land
at a random time (start-up, loading, mid-job, between steps, writing), and four make the
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

import pytest
from media_files import cfr_video
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
    return start_command(["caption", str(inputs)], out, **env)


def start_command(command: list[str], out: Path, **env: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(FAKE_CLI), *command, "--model", "fake"]
    argv += ["--out", str(out), "--no-progress"]
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
            # Any moment of start-up: imports, listing, repair, the first decodes.
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


@pytest.mark.parametrize("command", ["frames", "run-openai-batch"])
def test_frames_and_batch_files_killed_and_rerun_end_with_every_row_once(
    tmp_path: Path, command: str
) -> None:
    """``mmbatch frames`` and ``mmbatch run-openai-batch`` resume like ``caption``: killed
    at random moments and run again, every input ends with exactly one row, the row an
    uninterrupted run writes."""
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

    reference = tmp_path / "reference.jsonl"
    job = start_command(args, reference)
    assert job.wait(timeout=120) in (0, 1), job.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    expected = rows_of(reference)
    assert len(expected) == (30 if command == "run-openai-batch" else 3 * 16)

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    out = tmp_path / "out.jsonl"
    killed_mid_job = 0
    for round_no in range(6):
        before = len(whole_rows(out))
        job = start_command(args, out)
        while job.poll() is None and len(whole_rows(out)) <= before:
            time.sleep(0.005)
        kill_after(job, rng.uniform(0, 8 * float(STEP_SECONDS)))
        job.stderr.close()  # type: ignore[union-attr]
        rows = rows_of(out)
        assert len(rows) >= before, f"rows were lost in round {round_no}, seed {seed}"
        killed_mid_job += job.returncode == -signal.SIGKILL and len(rows) < len(expected)
    final = start_command(args, out)
    assert final.wait(timeout=120) == job_code(expected), final.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    final.stderr.close()  # type: ignore[union-attr]
    rows = rows_of(out)
    assert sorted(rows) == sorted(expected), f"seed {seed}"
    for item_id, row in rows.items():
        assert stable(row) == stable(expected[item_id]), (item_id, seed)
    assert killed_mid_job >= 2, f"seed {seed}: only {killed_mid_job} kills landed mid-job"


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
