"""The live start-up line: one line on a terminal that names the engine's phase, read from
vLLM's log as it is written, and goes away once the engines are ready.

The fast tests drive the line through its seams (a log file written here, a count of
engines ready) on a real pseudo-terminal; the slow one runs the command on a pseudo-terminal
with the tiny model, so that vLLM's own log lines are shown to be picked up."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY_ENGINE_FLAGS

from mmbatch.engine import startup_line
from mmbatch.engine.startup_line import CLEAR, PHASES, TICK, StartupLine, phase_of

VLLM_LINES = [  # as vLLM 0.32 writes them into the log mmbatch gives it
    "INFO 2026-12-05 07:48:18,593 [api_utils.py:286] non-default args: {'enforce_eager': True}",
    "INFO 2026-12-05 07:48:28,045 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
    "config: model='/tmp/tiny'",
    "INFO 2026-12-05 07:48:34,892 [cpu_model_runner.py:68] Starting to load model /tmp/tiny...",
    "INFO 2026-12-05 07:48:34,990 [default_loader.py:501] Loading weights took 0.01 seconds",
]


def read_all(fd: int, wait: float = 0.5) -> str:
    """What the terminal's other end has received (waiting ``wait`` s for more)."""
    chunks = []
    while select.select([fd], [], [], wait)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        wait = 0.1
    return b"".join(chunks).decode("utf-8", "replace")


def read_until(fd: int, drawn: str, seconds: float = 30.0) -> str:
    """What the terminal's other end receives until it has received ``drawn`` (a pattern),
    read as it comes: the line is drawn at a tick, which a loaded machine may delay."""
    said = ""
    deadline = time.monotonic() + seconds
    while not re.search(drawn, said, re.DOTALL):
        assert time.monotonic() < deadline, f"{drawn!r} not drawn within {seconds} s: {said!r}"
        if select.select([fd], [], [], 0.1)[0]:
            said += os.read(fd, 65536).decode("utf-8", "replace")
    return said


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The line's clock, set by the test: the seconds it shows are the ones the test says."""
    now = [1000.0]
    monkeypatch.setattr(startup_line, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_the_line_follows_vllm_s_log_and_the_engines_ready_on_a_terminal(
    tmp_path: Path, clock: list[float]
) -> None:
    log = tmp_path / "o.jsonl.vllm.log"
    log.write_text("an earlier run's line: Starting to load model x\n")  # appended to: skipped
    ready = [0]
    master, slave = os.openpty()
    try:
        with StartupLine(log, engines=2, ready=lambda: ready[0], fd=slave) as line:
            assert line.shows
            first = read_until(master, "engines ready 0 of 2")
            with log.open("a") as file:
                for text in VLLM_LINES[:3]:
                    file.write(text + "\n")
            loading = read_until(master, "loading weights, 0 s, engines ready 0 of 2")
            clock[0] += 3
            ready[0] = 1
            print("mmbatch: a line printed while it shows", file=sys.stderr)
            later = read_until(master, "loading weights, 3 s, engines ready 1 of 2")
        after = read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert f"{CLEAR}mmbatch: starting vLLM: importing vLLM, 0 s, engines ready 0 of 2" in first
    assert "mmbatch: starting vLLM: loading weights" in loading  # the furthest phase logged
    assert "engines ready 0 of 2" in loading
    assert "engines ready 1 of 2" in later
    assert after.endswith(CLEAR) or after == ""  # taken off once the engines are ready
    assert (first + loading + later + after).endswith(CLEAR)
    assert "\n" not in first + loading + later + after  # one line, rewritten in place


def test_a_line_printed_meanwhile_takes_the_status_line_off_first(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    master, slave = os.openpty()
    saved = sys.stderr
    try:
        with open(os.dup(slave), "w") as terminal:
            sys.stderr = terminal  # a command's stderr: the same terminal
            with StartupLine(log, engines=1, fd=slave):
                said = read_until(master, "starting vLLM: importing vLLM")
                sys.stderr.write("mmbatch: warning: something")  # print's two writes,
                time.sleep(5 * TICK)  # far apart: the line waits for the second
                sys.stderr.write(" to say\n")
                said += read_until(master, "to say.*starting vLLM: importing vLLM")
            sys.stderr = saved
        said += read_all(master)
    finally:
        sys.stderr = saved
        os.close(master)
        os.close(slave)
    before, _, rest = said.partition("mmbatch: warning: something to say")
    assert before.endswith(CLEAR), said  # the line was taken off: the warning starts a line
    assert "starting vLLM: importing vLLM" in rest  # and drawn again after it
    assert said.endswith(CLEAR)


@pytest.mark.parametrize("where", ["file", "pipe"])
def test_a_stderr_that_is_not_a_terminal_gets_nothing(tmp_path: Path, where: str) -> None:
    log = tmp_path / "vllm.log"
    if where == "file":
        read_end, write_end = None, os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT)
    else:
        read_end, write_end = os.pipe()
    stderr = sys.stderr
    try:
        with StartupLine(log, engines=1, fd=write_end) as line:
            assert not line.shows
            assert sys.stderr is stderr  # left alone
            time.sleep(2 * TICK)
    finally:
        os.close(write_end)
    written = (tmp_path / "err").read_text() if where == "file" else os.read(read_end, 100)
    assert not written
    if read_end is not None:
        os.close(read_end)


def test_no_line_where_vllm_s_log_goes_to_the_terminal_itself() -> None:
    master, slave = os.openpty()
    try:
        with StartupLine(None, engines=1, fd=slave) as line:
            assert not line.shows
            time.sleep(2 * TICK)
        assert read_all(master, 0.1) == ""
    finally:
        os.close(master)
        os.close(slave)


def test_phases_only_move_forward() -> None:
    names = [name for name, _ in PHASES]
    loading = names.index("loading weights")
    assert phase_of(VLLM_LINES[2]) == loading
    # A second engine's earlier line, in the same file, does not move the line back.
    assert phase_of(VLLM_LINES[1], after=loading) == loading
    assert phase_of(VLLM_LINES[3], after=loading) == names.index("profiling memory")
    assert phase_of("INFO [core.py:402] init engine (profile, create kv cache) took 1.55 s") == (
        names.index("getting ready")
    )


def test_a_log_that_cannot_be_read_ends_nothing(tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        with StartupLine(tmp_path / "no-folder" / "vllm.log", engines=1, fd=slave):
            said = read_until(master, "starting vLLM: importing vLLM")
        said += read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert "starting vLLM: importing vLLM" in said


@pytest.mark.slow
def test_the_command_on_a_terminal_shows_vllm_s_phases_then_the_summary(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "mmbatch", "caption", str(samples / "sunset.jpg")]
    argv += ["--model", str(tiny_vl_model), "--out", str(tmp_path / "o.jsonl")]
    argv += ["--max-tokens", "4", "--no-progress", *TINY_ENGINE_FLAGS]
    master, slave = os.openpty()
    try:
        job = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path)
        chunks = []
        while job.poll() is None:
            chunks.append(read_all(master, 1.0))
        chunks.append(read_all(master, 0.5))
    finally:
        os.close(master)
        os.close(slave)
    said = "".join(chunks)
    assert job.returncode == 0, said
    # The job's own line, printed while its engine's start (begun before the inputs were
    # listed) had the descriptors sent to vLLM's log, still reaches the terminal.
    assert "mmbatch: 1 item, model" in said, said
    shown = [part.split("\r")[0] for part in said.split(CLEAR)]
    phases = {name for name, _ in PHASES if any(f"starting vLLM: {name}," in s for s in shown)}
    assert "importing vLLM" in phases, said
    # At least one phase only vLLM's log says: it was read as the engine wrote it.
    assert phases & {"loading weights", "starting the engine core", "getting ready"}, said
    lines = said.replace(CLEAR, "\n").replace("\r", "").splitlines()
    timing = next(i for i, line in enumerate(lines) if line.startswith("time: "))
    assert "for the whole command: start-up" in lines[timing]
    assert lines[timing + 1].startswith("speed: ")
    assert "mmbatch: 1 engine on the CPU; starts without compiling" not in said  # eager given
    assert "mmbatch: 1 engine on the CPU" in said
    assert "(to see it here: -v)" in said


def test_a_terminal_that_goes_ends_the_line_not_the_job(tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        with StartupLine(tmp_path / "vllm.log", engines=1, fd=slave) as line:
            time.sleep(2 * TICK)
            os.close(master)  # the terminal is gone: each write to it fails
            master = -1
            time.sleep(3 * TICK)
            assert line.text().startswith("mmbatch: starting vLLM: importing vLLM")
        print("the job goes on", file=sys.stderr)
    finally:
        if master >= 0:
            os.close(master)
        os.close(slave)
