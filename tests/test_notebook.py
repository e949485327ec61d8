"""The notebook API: ``mmbatch.caption(inputs, model=...)`` returns rows in one call, and
``mmbatch.load_engine`` opens an engine that a ``with`` block closes, freeing its memory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import MANUAL, REPO, SCRIPTS

import mmbatch
from mmbatch.errors import ConfigError

SCRIPT = SCRIPTS / "notebook_session.py"
QUIET = mmbatch.RunConfig(progress=False)
VLLM_LINE = re.compile(r"\b(INFO|WARNING|DEBUG) (\d{4}-)?\d\d-\d\d \d\d:\d\d")
"""A line of vLLM's log, as it prints it (and as its log file has it, with the year)."""


def test_caption_takes_paths_pictures_and_bytes_and_keeps_their_order(
    samples: Path, tmp_path: Path
) -> None:
    from fake_engine import FakeEngine, expected_text
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("b.png", "a.jpg"):
        sample = "checkerboard.png" if name.endswith(".png") else "sunset.jpg"
        (folder / name).write_bytes((samples / sample).read_bytes())
    sunset = samples / "sunset.jpg"
    with Image.open(samples / "checkerboard.png") as opened:
        board = opened.copy()
    inputs = [sunset.read_bytes(), str(folder), board, sunset, str(samples / "truncated.jpg")]
    rows = mmbatch.caption(inputs, engine=FakeEngine(), prompt="Q?", run=QUIET)
    assert [row["id"] for row in rows] == [
        "#0",
        str(folder / "a.jpg"),
        str(folder / "b.png"),
        "#2",
        str(sunset),
        str(samples / "truncated.jpg"),
    ]
    for row in rows[:5]:
        assert row["error"] is None
        assert row["text"] == expected_text([row["media_hash"]], "Q?")
    # The same bytes, in memory and in two files: one content key.
    assert rows[0]["media_hash"] == rows[1]["media_hash"] == rows[4]["media_hash"]
    assert rows[5]["error"]["stage"] == "decode"
    one = mmbatch.caption(str(sunset), engine=FakeEngine(), run=QUIET)
    assert [row["id"] for row in one] == [str(sunset)]


def test_caption_takes_a_model_or_an_engine(samples: Path) -> None:
    with pytest.raises(ConfigError, match="takes a model or an engine"):
        mmbatch.caption(str(samples / "sunset.jpg"))
    with pytest.raises(ConfigError, match=r"inputs\[1\]: expected a path, a PIL image or bytes"):
        mmbatch.caption([str(samples / "sunset.jpg"), 3], model="m")


@pytest.mark.slow
def test_a_notebook_session_captions_in_one_call_and_frees_the_engine(
    tiny_vl_model: Path, samples: Path
) -> None:
    """In a process of its own: an in-process engine that closes takes vLLM's global state
    along, which the other tests' engines share."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_vl_model), str(samples)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["ids"] == [str(samples / "sunset.jpg"), "#1", "#2"]
    assert seen["errors"] == [None, None, None]
    # A file and its bytes are one picture: one answer (greedy); the board another.
    assert seen["texts"][0] == seen["texts"][2] == seen["again"]
    assert seen["texts"][1] != seen["texts"][0]
    # Closing the block let go of vLLM's LLM and engine, and with them the model and its
    # KV cache (the first call's engine went the same way: the second one started).
    assert seen["released"] == [True, True]
    assert seen["closed"] == "the engine is closed; start another to go on"


@pytest.mark.slow
def test_the_manuals_notebook_example_runs(tiny_vl_model: Path, tmp_path: Path) -> None:
    """The manual's notebook example as written (the Python API page's first), on the tiny
    model instead of Qwen."""
    page = (MANUAL / "python.md").read_text()
    example = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert "mmbatch.caption(" in example
    assert "mmbatch.load_engine(" in example
    tiny = f'model = "{tiny_vl_model}"'
    code = example.replace('model = "Qwen/Qwen2.5-VL-3B-Instruct"', tiny)
    code = code.replace('"max_model_len": 4096', '"max_model_len": 1024, "enforce_eager": True')
    code = code.replace("max_model_len=4096", "max_model_len=1024, enforce_eager=True")
    assert tiny in code
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ
        | {"MMBATCH_CACHE_DIR": str(tmp_path / "cache"), "TRANSFORMERS_VERBOSITY": "info"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The example's lines and none of vLLM's (235 lines of them), nor of what transformers
    # logs as the engines start: their log is in a file of its own, and stderr says where,
    # once per engine.
    assert "[transformers]" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    printed = proc.stdout.splitlines()[0]
    assert printed.startswith("[('samples/sunset.jpg', ")
    assert "('#1', " in printed
    assert printed.endswith("None)]")
    assert not VLLM_LINE.search(proc.stdout + proc.stderr), proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if "its log goes to" in line]
    assert len(said) == 2, proc.stderr[-3000:]
    logs = list((tmp_path / "cache" / "logs").iterdir())
    assert all(str(log) in proc.stderr for log in logs)
    assert len(VLLM_LINE.findall("".join(log.read_text() for log in logs))) > 20
    # The one-call caption's engine, laid out for its two pictures, started uncompiled.
    first = min(logs).read_text()
    assert "enforce_eager=True" in first, first[-3000:]
