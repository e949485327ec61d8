"""A kept engine (``mmbatch engine start``), for real: one tiny-model engine server for the
whole module, in a process of its own, and jobs run on it as a user runs them (commands in
processes of their own, so that what they import and how they die are real).

Its rows are those of the same job run alone; a job killed by ``kill -9`` leaves the engine
serving, and the next job resumes it; the socket is owner-only in an owner-only folder; a
job that needs another engine is refused in one line; ``engine list`` and ``engine stop``
manage it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import TINY_ENGINE_FLAGS
from picture_requests import write_pictures
from processes import alive

from mmbatch.engine.kept_folder import FOLDER_ENV, EngineFiles

NAME = "tiny"
ENGINE_FLAGS = [*TINY_ENGINE_FLAGS, "--engine-arg=max_num_seqs=4"]
"""The module's engine: the tiny engine's settings, four requests at a time, so that a job's
rows come in waves and a kill lands between them."""
JOB_FLAGS = ["--no-progress", "--max-tokens", "8", "--decode-workers", "0"]
CLIENT = """
import sys, time
from mmbatch.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("vllm", "torch") if m in sys.modules)
print("imported:", ",".join(heavy) or "neither", file=sys.stderr)
sys.exit(code)
"""
"""A job's command, saying afterwards whether it imported vLLM or torch."""

pytestmark = pytest.mark.slow


@dataclass
class Kept:
    model: Path
    folder: Path
    env: dict[str, str]

    def mmbatch(self, *argv: str, client: bool = False) -> subprocess.CompletedProcess[str]:
        code = ["-c", CLIENT] if client else ["-m", "mmbatch"]
        return subprocess.run(
            [sys.executable, *code, *argv], env=self.env, capture_output=True, text=True
        )

    def start(self) -> None:
        started = self.mmbatch("engine", "start", str(self.model), "--name", NAME, *ENGINE_FLAGS)
        assert started.returncode == 0, started.stderr[-3000:]
        assert started.stdout.strip() == NAME

    def pid(self) -> int | None:
        record = EngineFiles(self.folder, NAME).read_info()
        return None if record is None else int(record["pid"])


@pytest.fixture(scope="module")
def server(tiny_vl_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kept]:
    """The module's one engine server, stopped with the module."""
    folder = tmp_path_factory.mktemp("kept") / "engines"  # made by the engine's start
    kept = Kept(tiny_vl_model, folder, os.environ | {FOLDER_ENV: str(folder)})
    kept.start()
    yield kept
    pid = kept.pid()
    kept.mmbatch("engine", "stop", NAME)
    if pid is not None and alive(pid):
        os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def kept(server: Kept) -> Kept:
    """The module's engine, started again if a test stopped it (any order holds)."""
    pid = server.pid()
    if pid is None or not alive(pid):
        server.start()
    return server


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_job_on_the_kept_engine_writes_the_rows_of_the_same_job_alone(
    kept: Kept, tmp_path: Path
) -> None:
    write_pictures(tmp_path / "in", 4)
    job = ["caption", str(tmp_path / "in"), "--model", str(kept.model), *JOB_FLAGS]
    alone = kept.mmbatch(*job, "--out", str(tmp_path / "alone.jsonl"), *ENGINE_FLAGS)
    assert alone.returncode == 0, alone.stderr[-3000:]
    on_it = kept.mmbatch(*job, "--out", str(tmp_path / "kept.jsonl"), "--engine", NAME, client=True)
    assert on_it.returncode == 0, on_it.stderr[-3000:]
    # Nothing of vLLM's or torch's was imported by the job: it reaches the engine at once.
    assert "imported: neither" in on_it.stderr
    texts = {r["id"]: r["text"] for r in _rows(tmp_path / "alone.jsonl")}
    kept_rows = _rows(tmp_path / "kept.jsonl")
    assert {r["id"]: r["text"] for r in kept_rows} == texts
    assert all(r["error"] is None for r in kept_rows)
    summary = json.loads((tmp_path / "kept.jsonl.summary.json").read_text())
    assert summary["job"]["engines"].startswith(f"kept engine {NAME}: ")
    assert summary["stats"]["startup_seconds"] < 10.0  # seconds: no engine start, on any load


def test_the_socket_is_owner_only_in_an_owner_only_folder(kept: Kept) -> None:
    files = EngineFiles(kept.folder, NAME)
    assert stat.S_IMODE(os.lstat(kept.folder).st_mode) == 0o700
    for path in (files.socket, files.key, files.info, files.log):
        assert os.lstat(path).st_uid == os.geteuid()
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
    assert stat.S_ISSOCK(os.lstat(files.socket).st_mode)


def test_a_job_killed_leaves_the_engine_serving_and_the_next_job_resumes_it(
    kept: Kept, tmp_path: Path
) -> None:
    items = 24
    write_pictures(tmp_path / "in", items)
    out = tmp_path / "rows.jsonl"
    argv = ["caption", str(tmp_path / "in"), "--model", str(kept.model), "--engine", NAME]
    argv += ["--out", str(out), "--no-progress", "--max-tokens", "64", "--decode-workers", "0"]
    job = subprocess.Popen(
        [sys.executable, "-m", "mmbatch", *argv],
        env=kept.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 2):
        assert job.poll() is None, job.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    job.kill()  # kill -9, mid-job: its requests still in the engine
    job.wait()
    job.stderr.close()  # type: ignore[union-attr]
    written = len(_rows(out))
    assert 2 <= written < items  # the kill came mid-job
    pid = kept.pid()
    assert pid is not None
    assert alive(pid)  # the engine lives on
    resumed = kept.mmbatch(*argv)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _rows(out)
    assert sorted(r["id"] for r in rows) == [
        str(tmp_path / "in" / f"{i:03d}.png") for i in range(items)
    ]
    assert all(r["error"] is None for r in rows)
    assert kept.pid() == pid  # the same engine served both


def test_a_job_needing_another_engine_is_refused_in_one_line(kept: Kept, tmp_path: Path) -> None:
    write_pictures(tmp_path / "in", 1)
    out = tmp_path / "rows.jsonl"
    argv = ["caption", str(tmp_path / "in"), "--model", str(kept.model), "--engine", NAME]
    refused = kept.mmbatch(*argv, "--out", str(out), "--engine-arg", "max_model_len=2048")
    assert refused.returncode == 2
    lines = [ln for ln in refused.stderr.splitlines() if ln.startswith("mmbatch: error:")]
    assert lines == [
        f"mmbatch: error: the kept engine {NAME!r} was started with max_model_len=1024, the "
        "job asks for max_model_len=2048: start an engine with the job's settings"
    ]
    assert "Traceback" not in refused.stderr
    assert not list(tmp_path.glob("rows.jsonl*"))  # before any output


def test_engine_list_shows_it_and_engine_stop_ends_it(kept: Kept) -> None:
    pid = kept.pid()
    assert pid is not None
    listed = kept.mmbatch("engine", "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "MODEL", "PID", "UPTIME", "LAYOUT"]
    assert row.split()[:3] == [NAME, str(kept.model), str(pid)]
    assert "one engine on this machine" in row
    stopped = kept.mmbatch("engine", "stop", NAME)
    assert stopped.returncode == 0, stopped.stderr
    assert not alive(pid)
    assert not EngineFiles(kept.folder, NAME).socket.exists()
    assert kept.mmbatch("engine", "list").stdout.splitlines()[1:] == []
