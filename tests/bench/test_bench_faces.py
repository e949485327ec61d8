"""The whole-process sides of mmbatch's other faces (``mmbatch bench --whole`` with ``--modes
run,frames,frames-naive,kept``): their command lines, their ratios, the naive frames
script's frames against mmbatch's, the job's first request on its clock, and the kept
engine's side run whole (``tests/manual/test_bench_sweep.py`` runs every side at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from processes import alive, in_session
from test_bench import run_whole_sides

from mmbatch import cli

TESTS = Path(__file__).resolve().parents[1]

SIDE: dict[str, Any] = {
    "model": "/models/m",
    "max_tokens": 8,
    "temperature": 0.7,
    "top_p": 0.9,
    "seed": 0,
    "common_engine_args": {"max_model_len": 1024, "enforce_eager": True},
    "mmbatch_engine_args": {"max_num_seqs": 64},
    "engines_per_gpu": 2,
    "decode_workers": 3,
}


def parsed(argv: list[str]) -> Any:
    """``argv`` (``python -m mmbatch ...``) as mmbatch's own parser reads it."""
    assert argv[1:3] == ["-m", "mmbatch"], argv
    return cli.build_parser().parse_args(argv[3:])


def test_the_run_side_asks_the_caption_prompt_through_a_one_question_recipe(
    tmp_path: Path,
) -> None:
    """``mmbatch run RECIPE``: the recipe asks the caption prompt of each picture and sets
    nothing else, the command line passes the sampling and engine arguments of the
    ``mmbatch`` side, so that its rows are the naive side's (one a picture)."""
    from mmbatch.bench.faces import recipe_file, run_argv
    from mmbatch.bench.whole import _mmbatch_argv
    from mmbatch.bench.workloads import CAPTION
    from mmbatch.recipe import load_recipe

    folder = tmp_path / "whole-2"
    recipe = load_recipe(str(recipe_file(folder)))
    assert [q.text for q in recipe.questions] == [CAPTION]
    assert recipe.model is None
    assert recipe.engine_kwargs() == {}
    ours = parsed(run_argv(SIDE, recipe_file(folder), folder, tmp_path / "o.jsonl"))
    caption = parsed(_mmbatch_argv(SIDE, folder, tmp_path / "o.jsonl"))
    assert (ours.command, ours.recipe, ours.inputs) == (
        "run",
        str(recipe_file(folder)),
        [str(folder)],
    )
    same_flags = ["model", "max_tokens", "temperature", "top_p", "top_k", "min_p"]
    same_flags += ["repetition_penalty", "engine_arg", "engines_per_gpu", "decode_workers"]
    for same in same_flags:
        assert getattr(ours, same) == getattr(caption, same), same
    assert ours.temperature == 0.7
    assert "max_num_seqs=64" in ours.engine_arg


def test_the_frames_sides_sample_one_frame_per_second_with_the_same_sampling(
    tmp_path: Path,
) -> None:
    from mmbatch.bench.faces import frames_argv, frames_naive_argv
    from mmbatch.bench.job_process import whole_sampling
    from mmbatch.bench.workloads import FRAME_PROMPT

    videos, out = tmp_path / "whole-videos", tmp_path / "o.jsonl"
    ours = parsed(frames_argv(SIDE, videos, out))
    assert (ours.command, ours.inputs, ours.fps) == ("frames", [str(videos)], 1.0)
    assert (ours.prompt, ours.max_tokens, ours.temperature) == (FRAME_PROMPT, 8, 0.7)
    naive = frames_naive_argv(SIDE, videos, out)
    assert naive[1].endswith("mmbatch/bench/frames_naive.py")
    settings = json.loads(naive[-1])
    assert (settings["fps"], settings["prompt"]) == (1.0, FRAME_PROMPT)
    assert settings["sampling"] == whole_sampling(SIDE)
    # The naive side's engine is vLLM's with the common arguments alone, as naive_job's.
    assert settings["engine"] == {"disable_log_stats": False, **SIDE["common_engine_args"]}


def test_the_naive_frames_script_takes_as_many_frames_as_mmbatch_frames(tmp_path: Path) -> None:
    """The same rate on both sides: each video gives the naive script's PyAV loop the frames
    ``mmbatch frames --fps 1`` lists for it (W3's videos: 10 fps, a key frame every 5 s)."""
    from mmbatch.bench.frames_naive import sampled_frames
    from mmbatch.bench.workloads import make_videos
    from mmbatch.media.options import VideoOptions
    from mmbatch.sources.timeline import frame_requests

    for seconds in (3, 7):
        [video] = make_videos(tmp_path / f"v{seconds}", 1, seconds, 32, seed=seconds)
        naive = [pts for pts, _ in sampled_frames(video, 1.0)]
        ours = frame_requests([str(video)], VideoOptions(sampling="fps", fps=1.0), "p")
        assert len(naive) == len(ours) == seconds
        assert naive == pytest.approx([float(k) for k in range(seconds)])


def test_videos_made_at_once_are_whole_distinct_and_made_once(tmp_path: Path) -> None:
    """W3's videos are made in processes of their own: each is a whole video of its length,
    none repeats another, a video cut short (its temporary file) is made again, and a video
    made is not made again."""
    import av

    from mmbatch.bench.workloads import make_videos

    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / ".video001.mp4.partial").write_bytes(b"cut short")
    videos = make_videos(folder, 3, 2, 32, seed=5)
    assert [v.name for v in videos] == ["video000.mp4", "video001.mp4", "video002.mp4"]
    assert sorted(p.name for p in folder.iterdir()) == [v.name for v in videos]
    firsts = []
    for video in videos:
        with av.open(str(video)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == 20  # 2 s at 10 fps
        firsts.append(frames[0].tobytes())
    assert len(set(firsts)) == 3
    made = [v.stat().st_mtime_ns for v in videos]
    assert make_videos(folder, 3, 2, 32, seed=5) == videos
    assert [v.stat().st_mtime_ns for v in videos] == made


def test_the_kept_job_runs_on_the_engine_its_side_starts(tmp_path: Path) -> None:
    """``mmbatch engine start`` is given the engine arguments and layout of the job that
    ``mmbatch caption --engine`` then runs, so that the engine does not refuse it."""
    from mmbatch.bench.faces import kept_job_argv, kept_start_argv
    from mmbatch.cli.options import engine_config_from
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.kept import refusal

    start = parsed(kept_start_argv(SIDE, "bench-kept"))
    job = parsed(kept_job_argv(SIDE, "bench-kept", tmp_path, tmp_path / "o.jsonl"))
    assert (start.verb, start.name, job.engine) == ("start", "bench-kept", "bench-kept")
    from mmbatch.cli.options import engine_args_from

    started = EngineConfig(start.model, engine_args_from(start))
    info = {
        "model": started.model,
        "engine_kwargs": dict(started.engine_kwargs),
        "gpus": start.gpus,
        "engines_per_gpu": start.engines_per_gpu,
        "media_per_prompt": {"image": 1},
    }
    assert refusal(info, engine_config_from(job), {"image": 1}) is None
    assert started.engine_kwargs["max_num_seqs"] == 64  # mmbatch's own arguments too


def test_each_face_is_measured_against_its_own_baseline() -> None:
    from mmbatch.bench.whole import WHOLE_ONLY_MODES, whole_ratios

    assert {"run", "frames", "frames-naive", "kept"} <= WHOLE_ONLY_MODES  # no workload form
    runs = [
        {"images": 4, "mode": mode, "wall_s": wall}
        for mode, wall in [("naive", 12.0), ("run", 8.0), ("mmbatch", 6.0), ("kept", 2.0),
                           ("kept", 1.0)]
    ] + [
        {"videos": 2, "mode": mode, "wall_s": wall}
        for mode, wall in [("frames-naive", 9.0), ("frames", 3.0)]
    ]  # fmt: skip
    assert whole_ratios(runs) == {
        "ratio_run_over_naive_4": 1.5,
        "ratio_mmbatch_over_naive_4": 2.0,
        "ratio_kept_over_mmbatch_4": 4.0,  # on the means
        "ratio_frames_over_frames-naive_2videos": 3.0,
    }


def test_the_table_gives_the_frames_captioned_the_kept_engines_first_request_and_tokens() -> None:
    from mmbatch.bench.driver import table

    parts = {"startup_s": 1.0, "work_s": 2.0, "exit_s": 0.5}
    runs = [
        {"videos": 2, "mode": "frames", "wall_s": 3.5, "frames": 120, **parts},
        {"images": 4, "mode": "kept", "wall_s": 3.5, "first_request_s": 0.42,
         "engine_start_s": 31.04, **parts},
        {"images": 2000, "mode": "openai-batch", "wall_s": 82.5, **parts,
         "tokens": {"prompt_tokens": 582000, "output_tokens": 255963}},
    ]  # fmt: skip
    lines = table({"workloads": {}, "whole_process": {"runs": runs}}).splitlines()
    assert lines[1].startswith("whole   2 videos frames ")
    assert lines[1].endswith(", 120 frames")
    assert lines[2].endswith(", first request at 0.42 s (the kept engine started in 31.0 s)")
    # The tokens a side's engine counted: two sides' work compares where they are the same.
    assert lines[3].endswith(", tokens 582,000 in, 255,963 out")


def test_the_bench_help_lists_the_faces_sides(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: no word cut at a hyphen
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = capsys.readouterr().out
    for mode in ("run (a recipe)", "frames, frames-naive", "kept (a job on a kept engine)"):
        assert mode in text


def test_a_jobs_first_request_to_its_engine_is_a_start_up_moment(tmp_path: Path) -> None:
    """``first_request``: when the job handed its first request to its engine, after the
    engine was ready and before the first row (a fresh process: the moments are its own)."""
    from mmbatch.bench.workloads import make_images

    folder = tmp_path / "pictures"
    make_images(folder, 3, 32, seed=0)
    out = tmp_path / "rows.jsonl"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from fake_engine import FakeEngine; "
        "from mmbatch.cli import main; "
        "sys.exit(main(['caption', sys.argv[2], '--out', sys.argv[3], '--model', 'fake', "
        "'--no-progress'], engine=FakeEngine()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(TESTS), str(folder), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), *sys.path])},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    phases = json.loads(out.with_name("rows.jsonl.summary.json").read_text())["stats"][
        "startup_phases"
    ]
    assert phases["engines_ready"] <= phases["first_request"] <= phases["first_row"], phases


@pytest.mark.slow
def test_the_kept_engines_job_is_timed_whole_and_the_engine_stopped(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    """``--modes kept``: an engine started for the side (its start apart), then ``mmbatch
    caption --engine`` timed from its command to its exit, its first request on its own
    clock, and the engine stopped after it."""
    [run] = run_whole_sides(tiny_vl_model, tmp_path, ["kept"])["runs"]
    assert (run["mode"], run["rows"], run["failed"]) == ("kept", 2, 0), run
    assert run["engine_start_s"] > 0
    phases = run["startup_phases"]
    order = ["imports_done", "engines_ready", "first_request", "first_row", "last_row", "exit"]
    assert [phases[name] for name in order] == sorted(phases[name] for name in order)
    assert run["first_request_s"] == phases["first_request"] < run["wall_s"]
    # Stopped: its process gone (and every process of its session), its log kept beside
    # the job's.
    assert not alive(run["engine_pid"])
    assert in_session(run["engine_pid"]) == []
    assert Path(run["log"] + ".engine").read_text()
