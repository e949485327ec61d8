"""The kill check's Ray form (``benchmarks/kill_check.py --ray``) kills a replica's process,
which it finds by the line each replica writes in the engine's log as it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kill_check import _replica_pids
from repo_paths import REPO

from mmbatch.integrations.ray_replica import say_replica_process


def test_each_replica_names_its_process_and_the_kill_check_finds_the_live_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rows.vllm.log"
    log.write_text("INFO vLLM's start-up log\n")
    # A replica Ray ended: its line stays in the log, its process is gone.
    said = "from mmbatch.integrations.ray_replica import say_replica_process as s; import sys; "
    ended = subprocess.run(
        [sys.executable, "-c", said + "s(sys.argv[1])", str(log)],
        env=os.environ | {"PYTHONPATH": str(REPO)},
        check=True,
    )
    assert ended.returncode == 0
    say_replica_process(str(log))  # the one running now: this process

    named = _replica_pids(log)
    assert len(named) == 2, log.read_text()
    assert named[-1] == os.getpid()
    assert _replica_pids(log, os.getsid(0)) == [os.getpid()]  # alive, in the session of this test


def test_without_a_log_file_the_replica_names_its_process_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say_replica_process(None)
    assert f"a Ray replica runs in process {os.getpid()} on " in capsys.readouterr().err
