"""The exhaustive Ctrl-C and SIGTERM stops (``tests/test_interrupt.py`` runs six at a fixed
seed): twenty stops of one job once rows started, at a random seed that a failure names."""

from __future__ import annotations

import random
from pathlib import Path

from test_interrupt import check_stops_after_rows_started


def test_sigint_and_sigterm_at_twenty_moments_after_rows_started_stop_the_job_in_seconds(
    tmp_path: Path,
) -> None:
    check_stops_after_rows_started(tmp_path, rounds=20, seed=random.randrange(1 << 30))
