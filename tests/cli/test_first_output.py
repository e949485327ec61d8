"""What a command prints, read as a user reads it on stderr: the summary's time (the whole
command first, then its parts), counts said in words that agree with them, the engines in a
user's terms, each kind of media's own default question, a job without a model that speaks
of no model, and a flag that has no effect on the inputs given."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine

from mmbatch import cli
from mmbatch.cli import EXIT_OK
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import Layout
from mmbatch.output.stats import JobStats, OutputTally
from mmbatch.output.summary import JobReport
from mmbatch.review.gallery import render
from mmbatch.sources import DEFAULT_PROMPTS
from mmbatch.words import agreeing, counted, counted_phrase


def rows_of(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in out.read_text().splitlines()]


def report(startup: float | None) -> JobReport:
    run = JobStats(total=6, started=0.0, finished=0.7)
    run.ok, run.output_tokens = 6, 60
    return JobReport(
        "o.jsonl", 6, 0, run, OutputTally(ok=6), "o.jsonl.summary.json", (), startup, 50.2
    )


def test_the_summary_says_the_whole_command_s_time_first_then_its_parts() -> None:
    lines = "\n".join(report(47.7).lines()).splitlines()
    timed = [line for line in lines if "time" in line or " s" in line.split(":")[0]]
    assert timed[0] == (
        "time: 50.2 s for the whole command: start-up 47.7 s, work 0.7 s, finishing 1.8 s"
    )
    assert [line.split(":")[0] for line in lines].index("time") < [
        line.split(":")[0] for line in lines
    ].index("speed")
    assert "speed: 8.57 items/s, 85.7 output tok/s, over the 0.7 s of work" in lines
    assert not any(line.startswith("start-up") for line in lines)  # said once, in its place
    # A job that started no engine in this process has only its work to time.
    assert "time: 0.7 s of work" in report(None).lines()[0]


def test_the_gallery_header_gives_the_whole_command_s_time_and_its_parts() -> None:
    stats = {"process_seconds": 50.2, "startup_seconds": 47.7, "wall_seconds": 0.7}
    page = render([], {"stats": stats, "job": {}}, lambda row: "", "t")
    assert (
        '<dd class="wall-time">50.2 s for the whole command: start-up 47.7 s, work 0.7 s, '
        "finishing 1.8 s</dd>"
    ) in page
    older = render([], {"stats": {"wall_seconds": 0.7}, "job": {}}, lambda row: "", "t")
    assert '<dd class="wall-time">0.7 s of work</dd>' in older


def test_counts_are_said_in_the_number_they_count() -> None:
    assert [counted(n, "item") for n in (0, 1, 2)] == ["0 items", "1 item", "2 items"]
    assert counted(1, "audio file") == "1 audio file"
    assert counted_phrase(1, "videos (caption them whole with --as-clip)") == (
        "1 video (caption it whole with --as-clip)"
    )
    assert counted_phrase(3, "hidden folders (not walked)") == "3 hidden folders (not walked)"
    assert [agreeing(n, "is", "are") for n in (0, 1, 2)] == ["are", "is", "are"]


def test_one_picture_and_what_the_walk_passed_over_are_said_in_the_singular(
    samples: Path, tmp_path: Path, tiny_vl_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("sunset.jpg", "clip.mp4", "tone.wav"):
        shutil.copyfile(samples / name, folder / name)
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder), "--model", str(tiny_vl_model), "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    err = capsys.readouterr().err
    assert "mmbatch: 1 item, model" in err
    assert "1 of 1 item: 1 ok, 0 failed" in err
    assert "1 audio file (the model takes no audio)" in err
    assert "1 video (caption it whole with --as-clip)" in err
    for wrong in ("1 items", "1 videos", "1 audio files"):
        # A count of one, not the end of a rate such as "67.31 items/s".
        assert re.search(rf"(?<![\d.]){wrong}\b", err) is None, wrong
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK  # resumed: all done
    assert "1 item already has a row; 0 items to do" in capsys.readouterr().err


def test_the_engines_are_said_in_a_user_s_terms() -> None:
    cpu = Layout(1, ((),), "no GPU is visible", uncompiled=True, requests_per_engine=6)
    assert cpu.plainly() == "1 engine on the CPU; starts without compiling"
    assert "requests per engine" not in cpu.plainly()
    assert Layout(1, (("0",), ("1",)), "r").plainly() == "2 engines, one per GPU"
    assert Layout(1, (("0",),), "r").plainly() == "1 engine on 1 GPU"
    shared = Layout(1, (("0",), ("1",), ("0",), ("1",)), "r", per_gpu=2, uncompiled=True)
    assert shared.plainly() == "4 engines, 2 on each of 2 GPUs; start without compiling"
    assert Layout(2, (("0", "1"),), "r").plainly() == "1 engine on 2 GPUs"
    assert Layout(2, (("0", "1"), ("2", "3")), "r").plainly() == "2 engines, each on 2 GPUs"
    assert Layout(1, ((),) * 2, "r", per_gpu=2).plainly() == "2 engines on the CPU"
    assert "already running" in Layout(1, ((),), "r", kept=True).plainly()


@pytest.mark.parametrize("verbose", [False, True])
def test_the_engines_line_keeps_its_reasons_for_v(
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    verbose: bool,
) -> None:
    from mmbatch.engine import registry
    from mmbatch.jobs import FileOutput, Job, run_job
    from mmbatch.sources.files import image_requests

    def fake_start(config: object, media: object, layout: Layout) -> tuple[FakeEngine, Layout]:
        return FakeEngine(), layout

    monkeypatch.setattr(registry, "shared_engine_and_layout", fake_start)
    log = None if verbose else str(tmp_path / "vllm.log")
    config = EngineConfig(str(tiny_vl_model), {}, log, "-v")
    job = Job(image_requests([str(samples / "sunset.jpg")], "p"))
    run_job(job, config, FileOutput.at(tmp_path / "o.jsonl"))
    err = capsys.readouterr().err
    assert "mmbatch: 1 engine on the CPU; starts without compiling\n" in err
    reasons = "mmbatch: engines: one engine on this machine (no GPU is visible; eager, uncompiled"
    assert (reasons in err) is verbose


def test_each_face_says_its_own_way_to_see_vllm_s_log(
    tiny_vl_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mmbatch.engine.vllm_settings
    from mmbatch.engine.builder import check_engine

    monkeypatch.setattr(mmbatch.engine.vllm_settings, "preflight", lambda config, media: None)
    check_engine(EngineConfig(str(tiny_vl_model), {}, "o.jsonl.vllm.log", "-v"), {"image": 1})
    assert capsys.readouterr().err == (
        "mmbatch: starting vLLM; its log goes to o.jsonl.vllm.log (to see it here: -v)\n"
    )
    check_engine(EngineConfig(str(tiny_vl_model), {}, "x.log"), {"image": 1})
    assert "(to see it here: vllm_log=None)" in capsys.readouterr().err


def test_each_kind_of_media_gets_its_own_default_question(
    samples: Path, tmp_path: Path, tiny_vl_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    inputs = [str(samples / "sunset.jpg"), str(samples / "clip.mp4")]
    argv = ["caption", *inputs, "--as-clip", "--model", str(tiny_vl_model), "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    prompts = {Path(row["source"]).suffix: row["prompt"] for row in rows_of(out)}
    assert prompts == {".jpg": DEFAULT_PROMPTS["image"], ".mp4": DEFAULT_PROMPTS["video"]}
    assert DEFAULT_PROMPTS["video"] == "Describe this video in one sentence."
    frames = tmp_path / "f.jsonl"
    argv = ["frames", str(samples / "clip.mp4"), "--num-frames", "2", "--model", "m"]
    assert main([*argv, "--out", str(frames), "--no-progress"], FakeEngine()) == EXIT_OK
    assert {row["prompt"] for row in rows_of(frames)} == {DEFAULT_PROMPTS["frame"]}


def test_audio_gets_the_audio_question(
    samples: Path, tmp_path: Path, tiny_audio_model: Path
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(samples / "tone.wav"), "--model", str(tiny_audio_model)]
    assert main([*argv, "--out", str(out), "--no-progress"], FakeEngine()) == EXIT_OK
    assert {row["prompt"] for row in rows_of(out)} == {DEFAULT_PROMPTS["audio"]}


def test_frames_without_a_model_print_only_what_applies(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, saved = tmp_path / "f.jsonl", tmp_path / "frames"
    argv = ["frames", str(samples / "clip.mp4"), "--num-frames", "2", "--save-frames", str(saved)]
    assert cli.main([*argv, "--out", str(out), "--no-progress"]) == EXIT_OK  # DecodeOnly
    err = capsys.readouterr().err
    assert "2 of 2 items: 2 ok, 0 failed" in err
    assert "media: 2 decoded" in err
    for said in ("token", "tok/s", "cache", "engine"):
        assert said not in err, said


def test_a_flag_without_effect_on_the_inputs_gets_one_warning(
    samples: Path, tmp_path: Path, tiny_vl_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(samples / "sunset.jpg"), "--fps", "2", "--sample-rate", "16000"]
    argv += ["--model", str(tiny_vl_model), "--out", str(out), "--no-progress"]
    assert main(argv, FakeEngine()) == EXIT_OK
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "mmbatch: warning: --fps has no effect: it applies to video, and none of the inputs "
        "is a video",
        "mmbatch: warning: --sample-rate has no effect: it applies to audio, and none of the "
        "inputs is audio",
    ]
    clip = ["caption", str(samples / "clip.mp4"), "--as-clip", "--fps", "2"]
    clip += ["--model", str(tiny_vl_model), "--out", str(tmp_path / "c.jsonl"), "--no-progress"]
    assert main(clip, FakeEngine()) == EXIT_OK
    assert "warning" not in capsys.readouterr().err


def test_a_ray_job_s_time_is_split_at_its_first_replica_s_engine_ready() -> None:
    import time

    from mmbatch.clock import process_seconds
    from mmbatch.integrations.replica_tally import ReplicaFigures, ReplicaTally, startup_split

    tally = ReplicaTally()
    now = time.time()
    tally.add("b", ReplicaFigures(), now - 0.1)
    tally.add("a", ReplicaFigures(), now - 0.2)  # the first replica ready: the work's start
    tally.add("c", ReplicaFigures())
    assert tally.ready_at() == now - 0.2
    began = time.perf_counter() - 10.0  # the driver's run began before any engine started
    assert process_seconds() > 0.3  # this process's start is before the engine's ready
    before = time.time()
    startup, work_began = startup_split(tally.ready_at(), began)
    after, worked, age = time.time(), time.perf_counter() - work_began, process_seconds()
    assert startup is not None
    # Both halves meet at the engine's ready (now - 0.2): the time since it, as the split
    # saw it, lies between the clock read before the split and the one read after (a loaded
    # machine stretches that span, not the split); process_seconds counts in clock ticks.
    since_ready = (before - (now - 0.2), after - (now - 0.2) + (after - before))
    tick = 0.02
    assert since_ready[0] - tick <= age - startup <= since_ready[1] + tick
    assert since_ready[0] - 0.001 <= worked <= since_ready[1] + 0.001  # work: since the ready
    assert startup_split(None, began) == (None, began)  # no engine: no start-up to split


def test_the_notebook_asks_each_kind_of_media_its_own_question_too(samples: Path) -> None:
    import mmbatch
    from mmbatch.pipeline import RunConfig

    quiet = RunConfig(progress=False)
    inputs = [str(samples / "clip.mp4"), (samples / "sunset.jpg").read_bytes()]
    rows = mmbatch.caption(inputs, engine=FakeEngine(), run=quiet)
    assert [row["prompt"] for row in rows] == [DEFAULT_PROMPTS["video"], DEFAULT_PROMPTS["image"]]
