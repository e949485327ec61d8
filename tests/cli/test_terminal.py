"""What a job command shows on its terminal: mmbatch's own lines; ``-q`` only the summary's
last line, ``--json`` the summary's object alone on stdout; what other libraries say (their
logging, their warnings, what they print) in the job's log file, unless ``-v``.

The commands run with the fake engine here; the noise of the real engines (transformers on a
clip job, Ray on a Ray job) is checked in ``tests/media/test_media_end_to_end.py`` and
``tests/integrations/test_ray_data.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import FAKE_CLI, RECIPES

from mmbatch.cli import EXIT_OK
from mmbatch.engine.logs import libraries_to_log


def job_argv(command: str, samples: Path, tmp_path: Path) -> list[str]:
    """Each job command over two of the samples, into ``tmp_path``."""
    pictures = [str(samples / "sunset.jpg"), str(samples / "checkerboard.png")]
    out = str(tmp_path / "out.jsonl")
    if command == "caption":
        return ["caption", *pictures, "--model", "fake", "--out", out]
    if command == "frames":  # no model: the frames are extracted, no engine started
        return ["frames", str(samples / "clip.mp4"), "--num-frames", "2", "--out", out]
    if command == "run":
        recipe = str(RECIPES / "short_caption.toml")
        return ["run", recipe, *pictures, "--model", "fake", "--out", out]
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "".join(
            json.dumps(batch_line(str(i), picture)) + "\n" for i, picture in enumerate(pictures)
        )
    )
    return ["run-openai-batch", str(requests), "--model", "fake", "--out", out]


def batch_line(custom_id: str, picture: str) -> dict[str, object]:
    content = [
        {"type": "text", "text": "Describe."},
        {"type": "image_url", "image_url": {"url": Path(picture).as_uri()}},
    ]
    body = {"model": "fake", "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


COMMANDS = ["caption", "frames", "run", "run-openai-batch"]


@pytest.mark.parametrize("command", COMMANDS)
def test_quiet_prints_the_summarys_last_line_alone(
    command: str, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = job_argv(command, samples, tmp_path)
    assert main([*argv, "-q", "--allow-outside-root"], FakeEngine()) == EXIT_OK
    said = capsys.readouterr()
    assert said.out == ""
    out = tmp_path / "out.jsonl"
    ok = len(out.read_text().splitlines())
    assert said.err.splitlines() == [
        f"rows written to {out}: {ok} ok, 0 failed; summary in {out}.summary.json"
    ]


@pytest.mark.parametrize("command", COMMANDS)
def test_json_prints_the_summary_alone_on_stdout(
    command: str, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = job_argv(command, samples, tmp_path)
    assert main([*argv, "--json", "--allow-outside-root"], FakeEngine()) == EXIT_OK
    said = capsys.readouterr()
    document = json.loads(said.out)  # one object, nothing around it
    assert said.out.count("\n") == 1
    out = tmp_path / "out.jsonl"
    assert document == json.loads(Path(f"{out}.summary.json").read_text())
    rows = len(out.read_text().splitlines())
    assert document["stats"]["total"] == document["stats"]["ok"] == rows
    assert document["stats"]["failed"] == 0
    assert "rows written to" in said.err  # the summary's lines stay on stderr


def test_quiet_and_verbose_do_not_go_together(tmp_path: Path, samples: Path) -> None:
    argv = job_argv("caption", samples, tmp_path)
    with pytest.raises(SystemExit) as exit:
        main([*argv, "-q", "-v"], FakeEngine())
    assert exit.value.code == 2


def test_what_libraries_log_and_warn_goes_to_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library's handler set up before the block, one set up inside it (as transformers
    sets its own when vLLM imports it half-way through a job), a logger with no handler (the
    last resort) and a warning: each in the log file, none on the terminal; with -v (None)
    each where the library sends it."""
    early = logging.getLogger("library_tests.early_library")
    early.addHandler(logging.StreamHandler(sys.stderr))
    early.propagate = False
    late = logging.getLogger("library_tests.late_library")
    late.propagate = False
    child = logging.getLogger("library_tests.late_library.models.video")
    unconfigured = logging.getLogger("library_tests.unconfigured")
    monkeypatch.setattr(logging.root, "handlers", [])  # a command's: pytest's set aside
    log = tmp_path / "job" / "out.jsonl.vllm.log"
    try:
        with libraries_to_log(log):
            assert not log.parent.exists()  # made by the first record, not before
            early.warning("early handler speaks")
            late.addHandler(logging.StreamHandler(sys.stderr))
            child.warning("late handler speaks")
            child.warning("and again")
            unconfigured.warning("nobody set me up")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn("a library's warning", UserWarning, stacklevel=1)
        assert capsys.readouterr().err == ""
        written = log.read_text()
        for text in ("early handler speaks", "late handler speaks", "and again"):
            assert written.count(text) == 1, written
        assert "nobody set me up" in written
        assert "UserWarning: a library's warning" in written
        # Afterwards (and with -v), the libraries' handlers are theirs again.
        with libraries_to_log(None):
            child.warning("to the terminal")
        early.warning("back on the terminal")
        assert capsys.readouterr().err == "to the terminal\nback on the terminal\n"
    finally:
        for logger in (early, late):
            logger.handlers.clear()


def test_vllms_import_lines_go_to_the_log_of_a_batch_job(samples: Path, tmp_path: Path) -> None:
    """``run-openai-batch`` reads its file with vLLM's request models, importing vLLM in the
    command's process, which logs its platform (Triton, the CPU backend) there: into the
    log, as the process prints it, not onto the terminal; stdout holds the summary alone."""
    argv = job_argv("run-openai-batch", samples, tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, str(FAKE_CLI), *argv, "--allow-outside-root", "-q", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    out = tmp_path / "out.jsonl"
    assert done.stderr.splitlines() == [
        f"rows written to {out}: 2 ok, 0 failed; summary in {out}.summary.json"
    ]
    assert json.loads(done.stdout)["stats"]["ok"] == 2
    assert "Triton" in Path(f"{out}.vllm.log").read_text()


OVERLAPPING_BLOCKS = """
import os, sys
from mmbatch.engine.logs import printed_to

first, second = printed_to(sys.argv[1]), printed_to(sys.argv[2])
first.__enter__()
os.write(1, b"while the first is open\\n")
second.__enter__()  # another thread's block, say: Ray starting while settings are checked
os.write(1, b"while both are open\\n")
first.__exit__(None, None, None)  # the first ends first
os.write(1, b"while the second is open\\n")
second.__exit__(None, None, None)
os.write(1, b"after both\\n")
"""


def test_printed_to_blocks_that_overlap_leave_the_terminal_as_it_was(tmp_path: Path) -> None:
    """Two ``printed_to`` blocks open at once that end in the order they began (the Ray
    command starts Ray on a thread, its log in the job's file, while its main thread checks
    the settings with vLLM's log dropped): what is printed goes to the block entered last
    of those open, and to the terminal once none is."""
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    done = subprocess.run(
        [sys.executable, "-c", OVERLAPPING_BLOCKS, str(first), str(second)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert first.read_text() == "while the first is open\n"
    assert second.read_text() == "while both are open\nwhile the second is open\n"
    assert done.stdout == "after both\n"


OTHER_THREADS = """
import sys, threading
from mmbatch.engine.logs import printed_to

def say(text):
    thread = threading.Thread(target=lambda: print(text, file=sys.stderr, flush=True))
    thread.start()
    thread.join()

with printed_to(sys.argv[1]):
    say("a job's own line, from another thread")
with printed_to(sys.argv[1], every_thread=True):
    say("an engine process's library, from another thread")
"""


def test_an_engine_processs_every_thread_prints_into_its_log(tmp_path: Path) -> None:
    """In a job's process another thread's lines still reach the terminal (the job's own,
    printed while an engine starts on a thread); in an engine's process, whose every line
    is its libraries', a thread's lines (transformers loading the processor beside
    ``vllm.LLM``) go to the log too."""
    log = tmp_path / "engine.log"
    done = subprocess.run(
        [sys.executable, "-c", OTHER_THREADS, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "a job's own line, from another thread\n"
    assert log.read_text() == "an engine process's library, from another thread\n"
