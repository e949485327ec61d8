"""The one-off measurements live beside the package, not in it: each runs by its path from
the repository's root (``python benchmarks/NAME.py``), with mmbatch importable as a user has
it installed, and the package keeps none of them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import PACKAGE, REPO

ONE_OFF_CHECKS = (
    "invariance_check",
    "kill_check",
    "memory",
    "startup_loads",
    "storage",
    "video_decode",
)


@pytest.mark.parametrize("name", ONE_OFF_CHECKS)
def test_a_one_off_check_runs_by_its_path_from_the_repository(name: str) -> None:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:"), done.stdout


@pytest.mark.parametrize("name", ONE_OFF_CHECKS)
def test_the_package_holds_no_one_off_check(name: str) -> None:
    assert not (PACKAGE / "bench" / f"{name}.py").exists()
