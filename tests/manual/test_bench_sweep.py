"""The benchmark on the tiny model as a user runs it: ``python -m mmbatch bench`` with every
side of every workload, vLLM's engine cores in processes of their own as on a GPU host
(``tests/bench/test_bench.py`` drives fewer sides, engine cores in-process, and two of the
datasets sides), every datasets side, and the whole processes of mmbatch's command and the
naive script timed from the command to its exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench import check_bench_command, check_datasets_sides

pytestmark = pytest.mark.slow


def test_the_bench_command_runs_every_side_on_the_tiny_model(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    check_bench_command(
        tiny_vl_model, tmp_path, ("naive", "prebuilt", "mmbatch"), engine_processes=True
    )


def test_every_datasets_side_is_a_whole_process_over_one_imagefolder(
    tiny_vl_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    check_datasets_sides(tiny_vl_model, tmp_path, ["ds-naive", "ds-map", "ds-whole"])


def test_whole_processes_are_timed_from_the_command_to_its_exit(
    tiny_vl_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmbatch.cli import main

    out = tmp_path / "report.json"
    argv = ["bench", "--model", str(tiny_vl_model)]
    argv += ["--workloads", "", "--modes", "naive,prebuilt,k2", "--whole", "3"]
    argv += ["--whole-repeats", "1", "--variant", 'k2={"engines_per_gpu": 2}']
    argv += ["--size", "56", "--max-tokens", "3", "--out", str(out)]
    argv += ["--work-dir", str(tmp_path / "work")]
    for arg in ("dtype=float32", "max_model_len=1024", "enforce_eager=true"):
        argv += ["--engine-arg", arg]
    # The bench drives here (each timed process is one of its own, as on the GPU host).
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    whole = json.loads(out.read_text())["whole_process"]
    assert [(r["mode"], r["side"], r["images"]) for r in whole["runs"]] == [
        ("naive", "naive", 3),  # prebuilt has no whole-process form
        ("k2", "mmbatch", 3),
    ]
    for run in whole["runs"]:
        assert (run["rows"], run["failed"]) == (3, 0), run
        assert run["startup_s"] > 0, run
        assert run["work_s"] > 0, run
        assert run["exit_s"] > -0.1, run  # the last row, then the exit
        assert run["startup_s"] + run["work_s"] + run["exit_s"] == pytest.approx(
            run["wall_s"], abs=0.05
        )
    # Where start-up went: the naive script's import of vLLM, mmbatch's phases in order.
    assert 0 < whole["runs"][0]["startup_phases"]["vllm_imported"] < whole["runs"][0]["startup_s"]
    phases = whole["runs"][1]["startup_phases"]
    order = ["inputs_listed", "engine_processes_spawned", "engines_ready", "first_row"]
    assert [phases[name] for name in order] == sorted(phases[name] for name in order)
    assert {"settings_checked", "engine_0_ready", "engine_1_ready"} <= phases.keys()
    # Each engine process's own start-up, on the job's clock.
    for engine in ("engine_0", "engine_1"):
        steps = [f"{engine}_{step}" for step in ("started", "vllm_imported", "llm_built", "ready")]
        assert phases["inputs_listed"] <= phases[steps[0]], phases
        assert [phases[s] for s in steps] == sorted(phases[s] for s in steps), phases
    naive, k2 = (r["wall_s"] for r in whole["runs"])
    assert whole["ratio_k2_over_naive_3"] == pytest.approx(naive / k2)
    # Two engines on this machine (no GPU), as the variant asked.
    log = Path(whole["runs"][1]["log"]).read_text()
    assert "2 engines on this machine" in log
    assert "whole k2_over_naive_3 =" in stdout


def test_every_face_is_timed_whole_against_its_baseline(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    """``--modes naive,run,frames,frames-naive,kept,mmbatch``: every face's side a whole
    process (the kept engine's job on an engine started for it), each with its rows, its
    start-up by phase and its ratio against its own baseline."""
    from mmbatch.cli import main

    out = tmp_path / "report.json"
    modes = ["naive", "run", "frames", "frames-naive", "kept", "mmbatch"]
    argv = ["bench", "--model", str(tiny_vl_model), "--workloads", "", "--modes", ",".join(modes)]
    argv += ["--whole", "4", "--whole-repeats", "1", "--videos", "2", "--video-seconds", "3"]
    argv += ["--size", "56", "--max-tokens", "3", "--out", str(out)]
    argv += ["--work-dir", str(tmp_path / "work")]
    for arg in ("dtype=float32", "max_model_len=1024", "enforce_eager=true"):
        argv += ["--engine-arg", arg]
    assert main(argv) == 0
    whole = json.loads(out.read_text())["whole_process"]
    runs = {r["mode"]: r for r in whole["runs"]}
    assert sorted(runs) == sorted(modes)
    for mode, run in runs.items():
        frames = mode.startswith("frames")
        assert (run["rows"], run["failed"]) == (6 if frames else 4, 0), run
        assert run["startup_s"] > 0, run
        phases = run["startup_phases"]
        if mode.endswith("naive"):
            assert phases["vllm_imported"] < phases["engine_ready"] < phases["exit"], run
        else:
            order = ["imports_done", "engines_ready", "first_request", "first_row", "exit"]
            assert [phases[name] for name in order] == sorted(phases[name] for name in order)
    assert runs["frames"]["frames"] == runs["frames-naive"]["frames"] == 6  # 2 videos of 3 s
    assert runs["kept"]["first_request_s"] < 3.0  # the engine kept: no start-up to wait for
    assert set(whole) - {"runs"} == {
        "ratio_run_over_naive_4",
        "ratio_mmbatch_over_naive_4",
        "ratio_kept_over_mmbatch_4",
        "ratio_frames_over_frames-naive_2videos",
    }
