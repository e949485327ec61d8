"""A Ray job stopped by Ctrl-C, resumed, stopped by SIGTERM, and resumed to its end: 130
then 143, the local runner's lines, no traceback, nothing the job started left running (the
local Ray it started, its actor and engine), and every id exactly once at the end. The
default tier stops local jobs (``tests/test_interrupt.py``); a Ray job's stop is Ray's
start and end around the same runner, tested here because each run starts a Ray of its own."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from test_ray_data import check_ray_job_stopped_then_resumed, local_ray

__all__ = ["local_ray"]  # the module's Ray, as the default tier's tests have it


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_and_sigterm_stop_a_ray_job_like_a_local_one_and_it_resumes_exactly(
    local_ray,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    signals = (signal.SIGINT, signal.SIGTERM)
    check_ray_job_stopped_then_resumed(tiny_vl_model, tmp_path, capsys, signals)
