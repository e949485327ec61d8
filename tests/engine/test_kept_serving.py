"""A kept engine's bookkeeping, fast: its server's loop (``kept_server.serve``) on the fake
engine, in a thread, behind a real owner-only Unix socket, with jobs connecting through
``connect_engine`` as a job does. ``test_kept_engine.py`` runs the same on a real vLLM
engine in a process of its own; here, what a job gone does to the engine's queue, what two
jobs at once get, and who may reach the engine at all."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from picture_requests import caption_requests, write_pictures

from mmbatch.cli import EXIT_INTERRUPTED, main
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.kept import KeptEngine, connect_engine, refusal
from mmbatch.engine.kept_folder import FOLDER_ENV, EngineFiles, check_private_folder
from mmbatch.engine.kept_server import _Shared, serve
from mmbatch.errors import ConfigError
from mmbatch.jobs import Job, run_in_memory
from mmbatch.pipeline import RunConfig, close_pipeline
from mmbatch.types import LoadedRequest, Restarts, Result, Sampling

NAME = "fake"
MODEL = "org/kept"
RECORD = {
    "model": MODEL,
    "engine_kwargs": {"max_model_len": 1024, "enable_prefix_caching": True},
    "gpus": None,
    "engines_per_gpu": None,
    "batch_invariant": False,
    "media_per_prompt": {"image": 1},
    "pid": os.getpid(),
    "started": 0.0,
    "ready": True,
    "layout": "one fake engine",
}


class GatedEngine(FakeEngine):
    """The fake engine, finishing nothing while ``running`` is clear: what a test puts in it
    stays there until the test says, however slowly a loaded machine runs the test."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.running = threading.Event()
        self.running.set()
        self.restarted = Restarts()

    def restarts(self) -> Restarts:
        return self.restarted

    def step(self) -> list[Result]:
        if not self.running.is_set():
            time.sleep(0.01)
            return []
        return super().step()


@dataclass
class Served:
    engine: GatedEngine
    files: EngineFiles
    stop: threading.Event
    shared: _Shared


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    folder = tmp_path / "engines"
    monkeypatch.setenv(FOLDER_ENV, str(folder))
    files = EngineFiles.of(NAME, create=True)
    engine = GatedEngine(per_step=1, step_seconds=0.05)
    listener = Listener(str(files.socket), family="AF_UNIX", authkey=files.new_key())
    files.write_info(RECORD)
    stop = threading.Event()
    shared = _Shared(EngineConfig(MODEL), "one fake engine", None, engine.capacity())
    loop = threading.Thread(target=serve, args=(engine, listener, shared, stop), daemon=True)
    loop.start()
    yield Served(engine, files, stop, shared)
    stop.set()
    loop.join(timeout=10)
    assert not loop.is_alive()


def _job(tmp_path: Path, count: int, prompt: str = "Describe.") -> Job:
    return Job(caption_requests(write_pictures(tmp_path / "in", count), [prompt]))


def _run(job: Job, engine: KeptEngine) -> list[dict[str, object]]:
    try:
        rows, _ = run_in_memory(job, engine, RunConfig(progress=False, decode_workers=0))
    finally:
        close_pipeline(engine)
        engine.close()
    return rows


def test_a_job_gone_leaves_nothing_in_the_engine_and_the_next_job_is_served(
    served: Served, tmp_path: Path
) -> None:
    first = connect_engine(NAME)
    job = _job(tmp_path, 12)
    served.engine.running.clear()  # none of them can finish meanwhile
    for request in job.requests[:8]:  # added, not yet run: then the job is gone
        first.add(LoadedRequest(request, ()), [], Sampling())
    while len(served.engine.added) < 8:
        time.sleep(0.01)
    first._conn.close()  # as the kernel closes a killed job's socket
    deadline = time.monotonic() + 60
    while served.engine.num_unfinished() and time.monotonic() < deadline:
        time.sleep(0.01)
    # its requests left the engine, aborted: none of them ran
    assert served.engine.num_unfinished() == 0
    assert served.engine.steps == 0
    served.engine.running.set()
    rows = _run(job, connect_engine(NAME))
    assert [row["error"] for row in rows] == [None] * 12
    assert all(str(row["text"]).endswith("|Describe.") for row in rows)
    assert len({row["text"] for row in rows}) == 12  # each its own picture's answer


def test_the_engines_restarts_while_a_job_runs_are_counted_in_its_summary_apart_from_work(
    served: Served, tmp_path: Path
) -> None:
    """The kept engine restarts its engine processes in its own process: a job is told of
    those that came while it ran, and its summary counts them as it counts its own engine's
    (``restarts``, ``restart_seconds``, left out of the work's time); one before it joined
    is not its own."""
    served.engine.restarted = Restarts(1, 30.0)  # before the job: the engine's, not the job's
    deadline = time.monotonic() + 60
    while served.shared.restarts != served.engine.restarted and time.monotonic() < deadline:
        time.sleep(0.01)
    engine = connect_engine(NAME)
    step = served.engine.step

    def restarted_at_the_first_step() -> list[Result]:
        served.engine.restarted = Restarts(2, 34.5)  # one more, of 4.5 s, during the job
        return step()

    served.engine.step = restarted_at_the_first_step  # type: ignore[method-assign]
    try:
        rows, stats = run_in_memory(
            _job(tmp_path, 6), engine, RunConfig(progress=False, decode_workers=0)
        )
    finally:
        close_pipeline(engine)
        engine.close()
    assert [row["error"] for row in rows] == [None] * 6
    assert (stats.restarts, stats.restart_seconds) == (1, 4.5)


def test_ctrl_c_of_a_job_on_the_kept_engine_takes_its_requests_out_and_exits_130(
    served: Served, tmp_path: Path
) -> None:
    """The job's command in a process of its own, with decode workers, Ctrl-C sent to its
    group as a terminal sends it: exit 130 with no traceback (the workers leave Ctrl-C to
    the job), its requests aborted in the engine, not run to their end, and the same
    command then finishes the job on the same engine."""
    items = 60
    write_pictures(tmp_path / "in", items)
    out = tmp_path / "rows.jsonl"
    argv = [sys.executable, "-m", "mmbatch", "caption", str(tmp_path / "in"), "--model", MODEL]
    argv += ["--engine", NAME, "--out", str(out), "--no-progress", "--decode-workers", "2"]
    job = subprocess.Popen(argv, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().count("\n") >= 2):
        assert job.poll() is None, job.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(job.pid, signal.SIGINT)
    assert job.wait(timeout=10) == EXIT_INTERRUPTED
    stderr = job.stderr.read().decode()  # type: ignore[union-attr]
    job.stderr.close()  # type: ignore[union-attr]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1].endswith("run the same command again to resume")
    while served.engine.num_unfinished() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.engine.num_unfinished() == 0
    assert served.engine.steps < items  # aborted, not run to their end
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert len(out.read_text().splitlines()) == items


def test_two_jobs_at_once_each_get_their_own_rows(served: Served, tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    jobs = [_job(tmp_path / "a", 10, "First?"), _job(tmp_path / "b", 10, "Second?")]
    results: list[list[dict[str, object]]] = [[], []]

    def run(i: int) -> None:
        results[i] = _run(jobs[i], connect_engine(NAME))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for rows, prompt in zip(results, ["First?", "Second?"], strict=True):
        assert len(rows) == 10
        assert all(str(row["text"]).endswith(f"|{prompt}") for row in rows)


def test_only_the_key_holder_may_connect(served: Served) -> None:
    with pytest.raises(Exception, match="digest"):
        Client(str(served.files.socket), family="AF_UNIX", authkey=b"guessed")
    rows_before = served.engine.num_unfinished()
    connect_engine(NAME).close()  # the engine still serves after the refusal
    assert served.engine.num_unfinished() == rows_before


def test_a_folder_others_may_reach_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_folder = tmp_path / "engines"
    open_folder.mkdir(mode=0o755)
    os.chmod(open_folder, 0o755)
    with pytest.raises(ConfigError, match=r"mode 0755: others may reach it"):
        check_private_folder(open_folder)
    monkeypatch.setenv(FOLDER_ENV, str(open_folder))
    with pytest.raises(ConfigError, match="mode 0755"):
        connect_engine(NAME)
    assert main(["engine", "list"]) == 2
    os.chmod(open_folder, 0o700)
    check_private_folder(open_folder)
    made = tmp_path / "new" / "engines"
    monkeypatch.setenv(FOLDER_ENV, str(made))
    EngineFiles.of(NAME, create=True)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_what_makes_a_job_need_another_engine() -> None:
    same = EngineConfig(MODEL, {"max_model_len": 1024})
    assert refusal(RECORD, same, {"image": 1}) is None
    assert refusal(RECORD, EngineConfig(MODEL), {"image": 1}) is None  # left to the engine
    longer = EngineConfig(MODEL, {"max_model_len": 2048})
    assert "started with max_model_len=1024" in str(refusal(RECORD, longer, {}))
    assert "runs org/kept, not org/other" in str(refusal(RECORD, EngineConfig("org/other"), {}))
    assert "--media-per-prompt image=2" in str(refusal(RECORD, same, {"image": 2}))
    assert "video" in str(refusal(RECORD, same, {"video": 1}))


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    said = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    return int(said.stdout)


def test_engine_list_shows_the_live_engine_and_forgets_a_dead_ones_record(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = EngineFiles.of("gone", create=True)
    gone.write_info({**RECORD, "pid": _dead_pid()})
    assert main(["engine", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "MODEL", "PID", "UPTIME", "LAYOUT"]
    assert lines[1].split()[:3] == [NAME, MODEL, str(os.getpid())]
    assert lines[1].endswith("one fake engine")
    assert len(lines) == 2  # the dead engine is not listed, and its record is gone
    assert gone.read_info() is None


def test_engine_stop_ends_the_serving_and_removes_the_engines_files(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mmbatch engine stop NAME`` asks the engine to stop on its socket, waits for its
    process and every process of its session to end (an engine core still tearing down
    holds the GPU the next job wants), and removes its files. (The serving loop here runs
    in the test's own process, which the stop must not signal: the record names a stand-in
    that ends as a server's process does, once its socket is closed, leaving a child in its
    session that ends a second later.)"""
    from mmbatch.lifetime import live_processes

    socket = str(served.files.socket)
    stand_in = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.5)'])\n"
            f"while os.path.exists({socket!r}): time.sleep(0.02)",
        ],
        start_new_session=True,  # as the server leads a session of its own
    )
    served.files.write_info({**RECORD, "pid": stand_in.pid})
    assert main(["engine", "stop", NAME]) == 0
    assert live_processes(session=stand_in.pid) == []  # its child too
    assert stand_in.wait(timeout=60) == 0  # it ended of itself: the socket was closed
    assert f"mmbatch: engine {NAME} stopped" in capsys.readouterr().err
    assert served.files.read_info() is None
    assert not served.files.socket.exists()
    assert main(["engine", "stop", "nothing"]) == 2
    assert capsys.readouterr().err.strip() == "mmbatch: error: no kept engine 'nothing'"


def test_engine_start_refuses_in_one_line_before_it_starts_anything(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name taken by a live engine, or a media count that is not one, is refused with one
    line and exit code 2; no engine process is started (``served``'s record stays)."""
    assert main(["engine", "start", MODEL, "--name", NAME]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"mmbatch: error: an engine named {NAME!r} runs already (pid {os.getpid()})"
    assert main(["engine", "start", MODEL, "--name", "other", "--media-per-prompt", "image=x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mmbatch: error: --media-per-prompt 'image=x': not MODALITY=N (image, video, audio)"
    )
    assert served.files.read_info() == RECORD
    assert EngineFiles.of("other").read_info() is None
