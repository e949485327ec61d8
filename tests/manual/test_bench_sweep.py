"""The benchmark on the tiny model as a user runs it: ``python -m mmbatch bench`` with every
side of every workload, and every datasets side (``tests/bench/test_bench.py`` drives fewer
sides in its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench import bench_argv, check_workloads, run_datasets_sides

pytestmark = pytest.mark.slow


def test_the_bench_command_runs_every_side_on_the_tiny_model(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    argv = bench_argv(tiny_vl_model, tmp_path, "naive,prebuilt,mmbatch")
    proc = subprocess.run(
        [sys.executable, "-m", "mmbatch", *argv],
        capture_output=True,
        text=True,
        # vLLM's engine core in a process of its own, as on a GPU host.
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    check_workloads(report, ("naive", "prebuilt", "mmbatch"), proc.stdout)


def test_every_datasets_side_is_a_whole_process_over_one_imagefolder(
    tiny_vl_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    run_datasets_sides(tiny_vl_model, tmp_path, ["ds-naive", "ds-map", "ds-whole"])
