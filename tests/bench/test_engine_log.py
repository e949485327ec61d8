"""A whole-process run's report holds what vLLM's log says of its engines' build, read from
that run's own log files, and a side run again in the same work folder starts clean."""

from __future__ import annotations

from pathlib import Path

from mmbatch.bench.engine_log import engine_log_figures, run_logs
from mmbatch.bench.whole import clear_earlier_run

# vLLM 0.26's own lines, as its engine processes write them (two engines of one run).
ENGINE_LINES = """\
INFO 12-05 20:12:40 [gpu_model_runner.py] Model loading took 15.42 GiB memory and 2.131456 seconds
INFO 12-05 20:12:46 [monitor.py:34] torch.compile took 5.31 s in total
INFO 12-05 20:12:49 [gpu_model_runner.py] Graph capturing finished in 5 secs, took 0.52 GiB
INFO 12-05 20:12:49 [core.py:348] init engine (profile, create kv cache, warmup model) took 8.97 s
INFO 12-05 20:12:41 [gpu_model_runner.py] Model loading took 15.42 GiB memory and 2.402001 seconds
INFO 12-05 20:12:50 [core.py:348] init engine (profile, create kv cache, warmup model) took 9.20 s
"""


def test_a_runs_build_figures_come_from_its_own_logs_one_value_per_engine(tmp_path: Path) -> None:
    out = tmp_path / "whole-2000-mmbatch-0.jsonl"
    (tmp_path / "whole-2000-mmbatch-0.jsonl.vllm.log").write_text(ENGINE_LINES)
    spawn = "WARNING [system_utils.py:158] We must use the `spawn` multiprocessing start method."
    (tmp_path / "whole-2000-mmbatch-0.jsonl.log").write_text(f"mmbatch: 2000 items\n{spawn}\n")
    # Another run's logs, beside it, are not this run's.
    (tmp_path / "whole-2000-mmbatch-1.jsonl.vllm.log").write_text(ENGINE_LINES)
    (tmp_path / "whole-2000-naive-0.jsonl.log").write_text(ENGINE_LINES)

    assert [p.name for p in run_logs(out)] == [
        "whole-2000-mmbatch-0.jsonl.log",
        "whole-2000-mmbatch-0.jsonl.vllm.log",
    ]
    assert engine_log_figures(run_logs(out)) == {
        "model_loading_s": [2.131456, 2.402001],
        "torch_compile_s": [5.31],
        "graph_capture_s": [5.0],
        "init_engine_s": [8.97, 9.2],
        "spawn_warning": True,
    }
    # A Ray run's vLLM log lies beside its output folder.
    ray_out = tmp_path / "whole-2000-ray-0.jsonl"
    (tmp_path / "whole-2000-ray-0.vllm.log").write_text(ENGINE_LINES.splitlines()[3])
    assert engine_log_figures(run_logs(ray_out)) == {"init_engine_s": [8.97]}
    assert engine_log_figures([tmp_path / "gone.log"]) == {}


def test_a_side_run_again_in_the_same_work_folder_finds_nothing_of_its_earlier_run(
    tmp_path: Path,
) -> None:
    """A Ray side's rows are a folder, ``NAME``, with its summary and vLLM's log beside it;
    left there, the next bench in the same ``--work-dir`` resumed them (all rows done: a
    run of seconds) and read the old log."""
    earlier = ["whole-2-ray-0.jsonl.log", "whole-2-ray-0.vllm.log", "whole-2-ray-0.summary.json"]
    earlier += ["whole-2-ray-0.job.json", "whole-2-ray-0.jsonl"]
    for name in earlier:
        (tmp_path / name).write_text("x\n")
    (tmp_path / "whole-2-ray-0").mkdir()
    (tmp_path / "whole-2-ray-0" / "part-0.jsonl").write_text('{"id": "a"}\n')
    others = ["whole-2-ray-1.vllm.log", "whole-2-ray-01.jsonl", "whole-2.toml"]
    for name in others:
        (tmp_path / name).write_text("kept\n")

    clear_earlier_run(tmp_path / "whole-2-ray-0.jsonl")

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
