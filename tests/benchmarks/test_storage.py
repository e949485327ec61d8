"""The storage benchmark (``benchmarks/storage.py``) runs both its sides on a small workload
and reports what it measured with the command, workload, machine and versions it ran with."""

from __future__ import annotations

import json
from pathlib import Path

import storage


def test_the_storage_benchmark_compares_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    argv = ["--photos", "6", "--megapixels", "0.1", "--rounds", "1", "--out", str(out)]
    assert storage.main([*argv, "--work-dir", str(tmp_path / "work")]) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python benchmarks/storage.py --photos 6")
    assert report["workload"]["photos"] == 6
    assert report["machine"]["cpus"] >= 1
    assert "s3fs" in report["versions"]
    for side in ("local", "s3"):
        (run,) = report["runs"][side]
        assert run["items"] == 6
        assert run["failed"] == 0
        assert run["wall_s"] > 0
    assert report["runs"]["s3"][0]["server_cpu_s"] > 0  # the store did serve the job
    assert report["ratio_s3_to_local"] > 0
