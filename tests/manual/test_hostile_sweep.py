"""Every hostile file through the command on vLLM, budget and all
(``tests/media/test_hostile_corpus.py`` runs the corpus through the command with the fake
engine, and through the pipeline on vLLM with the tiny model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_media import CORPUS_ARGS, ENGINE_DEPENDENT
from test_hostile_corpus import check_corpus_rows, hostile

from mmbatch.cli import EXIT_ITEMS_FAILED

__all__ = ["hostile"]  # the corpus, made once for the module


@pytest.mark.slow
def test_the_hostile_corpus_through_the_command_on_vllm(
    hostile: tuple[Path, dict[str, object]], tmp_path: Path, tiny_vl_model: Path
) -> None:
    """The whole command on the real engine, budget and all: one row per input, each with its
    outcome (the strips refused by the model's resize rules), exit 1, no traceback."""
    folder, corpus = hostile
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += [*CORPUS_ARGS, "--no-progress", "--max-tokens", "4"]
    for arg in ("dtype=float32", "enforce_eager=true", "max_model_len=1024"):
        argv += ["--engine-arg", arg]
    proc = subprocess.run(
        [sys.executable, "-m", "mmbatch", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == EXIT_ITEMS_FAILED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    expected = {**corpus, **{k: v for k, v in ENGINE_DEPENDENT.items() if k in corpus}}
    for row in check_corpus_rows(out, expected):
        if row["error"] is None:
            assert row["output_tokens"], row
