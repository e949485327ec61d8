"""The manual's command examples run in order as written: a reader who runs a page's (or the
README's) examples one after another never meets a refusal the page did not mean, such as a
second job sent to the first one's ``--out`` (a different job there is refused on resume)."""

from __future__ import annotations

import re
import shlex
import shutil
from itertools import pairwise
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import MANUAL, README

from mmbatch.cli import EXIT_OK

JOB_COMMANDS = {"caption", "frames", "run", "run-openai-batch"}
RERUN_FLAGS = {"--retry-errors", "--force", "--no-progress", "-v", "--verbose"}
"""Flags a rerun of the same job may add: it is still the same job."""
PAGES = [README, *sorted(MANUAL.glob("*.md"))]


def commands(page: Path) -> list[list[str]]:
    """Every ``mmbatch`` command of ``page``'s shell examples, in order, as argv (without
    ``mmbatch``): continued lines joined, comments dropped, ``a && b`` as two."""
    found = []
    blocks = re.findall(r"```(?:sh|bash|console)\n(.*?)```", page.read_text(), re.S)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                end = words.index("&&") if "&&" in words else len(words)
                command, words = words[:end], words[end + 1 :]
                if command and command[0].endswith("mmbatch") and len(command) > 1:
                    found.append(command[1:])
    return found


def out_of(argv: list[str]) -> str | None:
    for flag, value in pairwise(argv):
        if flag == "--out":
            return value
    return None


def as_job(argv: list[str]) -> list[str]:
    """``argv`` without what a rerun of the same job may add (``RERUN_FLAGS``, and
    ``--limit N``, whose rows the same job without it keeps)."""
    words = [word for word in argv if word not in RERUN_FLAGS]
    limit = words.index("--limit") if "--limit" in words else None
    return words if limit is None else words[:limit] + words[limit + 2 :]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_a_pages_job_commands_never_send_another_job_to_an_earlier_ones_out(page: Path) -> None:
    written: dict[str, list[str]] = {}
    clashes = []
    for argv in commands(page):
        out = out_of(argv)
        if argv[0] not in JOB_COMMANDS or out is None:
            continue
        before = written.get(out)
        if before is not None and as_job(before) != as_job(argv) and "--overwrite" not in argv:
            clashes.append(f"{' '.join(before)}  THEN  {' '.join(argv)}")
        written[out] = argv
    assert clashes == []


def test_the_pages_scan_finds_the_commands_it_checks() -> None:
    """The check above is not empty: it reads the examples a reader runs."""
    video = commands(MANUAL / "video-audio.md")
    assert [argv[0] for argv in video[:4]] == ["frames", "frames", "caption", "caption"]
    assert out_of(video[0]) == "frames.jsonl"
    assert sum(len(commands(page)) for page in PAGES) > 30


def test_the_video_pages_frame_examples_run_in_order(
    tmp_path: Path, samples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frame captions, then frame extraction, as the page lists them, on a real video
    (the fake engine in vLLM's place; the model is only named)."""
    (tmp_path / "talks").mkdir()
    shutil.copyfile(samples / "clip.mp4", tmp_path / "talks" / "talk.mp4")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    frames = [argv for argv in commands(MANUAL / "video-audio.md") if argv[0] == "frames"]
    assert len(frames) == 2
    for argv in frames:
        assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK, argv
