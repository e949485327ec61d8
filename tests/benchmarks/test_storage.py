"""The storage benchmark (``benchmarks/storage.py``) runs both its sides on a small workload
and reports what it measured with the command, workload, machine and versions it ran with."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import storage
from memory import make_photos
from repo_paths import FAKE_CLI


def test_the_storage_benchmark_compares_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    argv = ["--photos", "6", "--megapixels", "0.1", "--rounds", "1", "--out", str(out)]
    assert storage.main([*argv, "--work-dir", str(tmp_path / "work")]) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python benchmarks/storage.py --photos 6")
    assert report["workload"]["photos"] == 6
    assert report["machine"]["cpus"] >= 1
    assert report["machine"]["gpus"]  # the cards, or "none (CPU)" where nvidia-smi is absent
    assert "s3fs" in report["versions"]
    for side in ("local", "s3"):
        (run,) = report["runs"][side]
        assert run["items"] == 6
        assert run["failed"] == 0
        assert run["wall_s"] > 0
    assert report["runs"]["s3"][0]["server_cpu_s"] > 0  # the store did serve the job
    assert report["ratio_s3_to_local"] > 0


def test_each_run_can_be_a_whole_command_in_the_order_asked(tmp_path: Path) -> None:
    """After ``--``, each run is a whole ``caption`` process (here the command with the fake
    engine) over the pictures of ``--photos-dir``, in the order ``--order`` names; the report
    keeps each process's exit code and its summary's counts, and the store's CPU."""
    pictures = tmp_path / "pictures"
    make_photos(pictures, 5, 0.05)
    out = tmp_path / "report.json"
    argv = ["--photos-dir", str(pictures), "--order", "local,s3,s3,local", "--out", str(out)]
    program = ["--program", f"{sys.executable} {FAKE_CLI}", "--work-dir", str(tmp_path / "w")]
    assert storage.main([*argv, *program, "--", "--model", "fake", "--max-tokens", "4"]) == 0
    report = json.loads(out.read_text())
    assert report["workload"]["order"] == "local,s3,s3,local"
    assert report["workload"]["photos"] == 5
    assert report["workload"]["job"].endswith("caption INPUT --model fake --max-tokens 4 --out OUT")
    for side in ("local", "s3"):
        assert len(report["runs"][side]) == 2
        for run in report["runs"][side]:
            assert run["returncode"] == 0
            assert (run["items"], run["failed"]) == (5, 0)
            assert run["summary"]["ok"] == 5
    # The runs wrote where their side says: the local ones beside the work folder, the
    # store's in the store (the server's CPU counted while they ran).
    assert sorted(p.name for p in (tmp_path / "w").glob("local-*.jsonl")) == [
        "local-0.jsonl",
        "local-3.jsonl",
    ]
    assert all(run["server_cpu_s"] > 0 for run in report["runs"]["s3"])
    assert report["store_cpu_per_photo"]["server_cpu_ms"] > 0
    # The host's busy CPU over a run holds the job's own (and any other process's).
    for run in report["runs"]["local"] + report["runs"]["s3"]:
        assert run["host_cpu_s"] >= 0.9 * run["job_cpu_s"] > 0
    assert report["medians"]["s3"]["host_cpu_s"] > 0
    assert isinstance(report["store_cpu_per_photo"]["host_cpu_ms"], float)


def test_an_order_without_both_sides_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        storage.main(["--order", "local,local", "--out", str(tmp_path / "r.json")])
    assert refused.value.code == 2
