"""``--ray`` where no Ray can be reached: one line and exit code 2 before anything is
written, as every other job that cannot start, never Ray's traceback and exit code 1 (which
says that some items failed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmbatch.cli import EXIT_JOB_FAILED

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def no_ray_cluster_on_this_host(seconds: float = 60) -> None:
    """Wait for no Ray cluster to run here: ``--ray auto`` joins any it finds (by its
    processes), so another test's cluster, still stopping, would be joined."""
    from ray._private.services import find_gcs_addresses

    deadline = time.monotonic() + seconds
    while find_gcs_addresses() and time.monotonic() < deadline:
        time.sleep(0.5)
    running = find_gcs_addresses()
    assert not running, f"a Ray cluster runs on this host ({set(running)}): --ray auto joins it"


def test_ray_auto_without_a_cluster_is_one_line_and_exit_2_before_any_output(
    samples: Path, tiny_vl_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rows"
    # No address from the environment, and Ray's own folder (where `ray start` leaves the
    # address of the cluster it started) one that no cluster used.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path / "ray")
    argv = ["caption", str(samples / "sunset.jpg"), "--model", str(tiny_vl_model)]
    argv += ["--out", str(out), "--ray", "auto", "--engine-arg", "max_model_len=1024"]
    no_ray_cluster_on_this_host()
    proc = subprocess.run(
        [sys.executable, "-m", "mmbatch", *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == EXIT_JOB_FAILED, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mmbatch: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(
        "mmbatch: error: could not reach the Ray cluster at 'auto': ConnectionError: "
    )
    assert errors[0].endswith("or run on a Ray of the job's own with --ray local)")
    assert proc.stderr.splitlines()[-1] == errors[0]
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("rows*"))
