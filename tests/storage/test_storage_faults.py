"""What a store that misbehaves does to a job, through the real command against the tests'
S3 server: an object denied or cut short mid-read is that item's error row and the job goes
on; no credentials is one line and exit 2 before any engine starts; the store stopped
mid-job stops the job loudly with its rows saved, and the same command, run once the store
is back, finishes it with every row exactly once."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import FAKE_CLI
from s3_server import Bucket, S3Server, faulty_proxy
from test_kill_resume import make_inputs

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED
from mmbatch.storage import objects


def test_a_denied_or_cut_short_object_is_its_rows_error_and_the_job_goes_on(
    s3: Bucket,
    s3_server: S3Server,
    samples: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("sunset.jpg", "denied.jpg", "cut.jpg"):
        s3.put(f"in/{name}", (samples / "sunset.jpg").read_bytes())
    monkeypatch.setattr(objects, "RETRY_PAUSE_S", 0.01)
    out = tmp_path / "out.jsonl"
    with faulty_proxy(s3_server) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.deny.add(f"/{s3.name}/in/denied.jpg")
        proxy.cut.add(f"/{s3.name}/in/cut.jpg")
        argv = ["caption", s3.url("in"), "--model", "fake", "--out", str(out), "--no-progress"]
        assert main(argv, FakeEngine()) == EXIT_ITEMS_FAILED
    rows = {Path(row["id"]).name: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["sunset.jpg"]["error"] is None
    assert rows["denied.jpg"]["error"]["kind"] == "unreadable"
    assert "access denied" in rows["denied.jpg"]["error"]["message"]
    assert rows["cut.jpg"]["error"]["kind"] == "unreadable"
    assert rows["cut.jpg"]["error"]["stage"] == "load"


def test_no_credentials_is_one_line_and_exit_2_before_any_engine(
    s3: Bucket,
    samples: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s3.put("in/sunset.jpg", (samples / "sunset.jpg").read_bytes())
    local = tmp_path / "pictures"
    local.mkdir()
    shutil.copyfile(samples / "sunset.jpg", local / "sunset.jpg")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    for inputs, out in ((s3.url("in"), str(tmp_path / "o.jsonl")), (str(local), s3.url("o"))):
        never = FakeEngine()
        argv = ["caption", inputs, "--model", "fake", "--out", out, "--no-progress"]
        code = main(argv, never)
        assert code == EXIT_JOB_FAILED
        assert never.added == []
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1
        assert errors[0].startswith("mmbatch: error: cannot ")
        assert "no credentials found" in errors[0]
    assert not (tmp_path / "o.jsonl").exists()


def test_a_store_stopped_mid_job_stops_it_loudly_and_the_same_command_resumes_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = S3Server()  # a server of this test's own: it is stopped half-way
    try:
        for key, value in server.environment().items():
            monkeypatch.setenv(key, value)
        bucket = Bucket(server, "faults")
        total = make_inputs(tmp_path / "in", items=30)
        inputs = bucket.upload(tmp_path / "in", "in")
        shutil.rmtree(tmp_path / "in")
        argv = [sys.executable, str(FAKE_CLI), "caption", inputs, "--model", "fake"]
        argv += ["--out", bucket.url("out.jsonl"), "--no-progress"]
        env = os.environ | {"FAKE_STEP_SECONDS": "0.15", "FAKE_PART_ROWS": "2"}
        job = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while len(bucket.keys("out.jsonl.parts")) < 3:  # some rows are saved
            assert job.poll() is None, job.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no part was written"
            time.sleep(0.05)
        server.stop()
        code = job.wait(timeout=120)
        err = job.stderr.read().decode()  # type: ignore[union-attr]
        job.stderr.close()  # type: ignore[union-attr]
        assert code == EXIT_JOB_FAILED, err[-3000:]
        assert "the store cannot be reached" in err
        assert "Traceback" not in err, err
        saved = re.search(r"The (\d+) rows? finished (?:is|are) saved in (\S+) \(", err)
        assert saved, err[-2000:]
        assert saved[2] == bucket.url("out.jsonl"), err[-2000:]
        assert 0 < int(saved[1]) < total
        assert err.rstrip().endswith("run the same command again to resume.")

        server.start()
        again = subprocess.run(argv, env=env, capture_output=True, timeout=300, check=False)
        said = again.stderr.decode()
        assert again.returncode == EXIT_ITEMS_FAILED, said[-3000:]
        assert f"resuming {bucket.url('out.jsonl')}: " in said
        kept = int(said.split(f"resuming {bucket.url('out.jsonl')}: ", 1)[1].split()[0])
        assert kept >= int(saved[1])  # what was said to be saved was
        rows = [json.loads(line) for line in bucket.get("out.jsonl").splitlines()]
        ids = [row["id"] for row in rows]
        assert len(ids) == len(set(ids)) == total
        assert not bucket.keys("out.jsonl.parts")
    finally:
        server.close()
