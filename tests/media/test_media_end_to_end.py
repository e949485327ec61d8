"""Video frames, clips and audio on the real vLLM CPU build with the tiny models.

Each test proves one of the promises on the real engine: a frame's row carries the text that
frame gets when run alone; the budget's prompt lengths are the ones vLLM counts; a clip too
long for the model is shrunk (or refused, saying by how much) instead of reaching vLLM; audio
decoded and resampled by PyAV is accepted by the tiny Qwen2-Audio at 25 tokens a second.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from budgets import budget_for
from conftest import TINY_ENGINE_FLAGS, TINY_ENGINE_KWARGS
from media_files import cfr_video, scene_video, write_audio

from mmbatch.media.options import MediaOptions, VideoOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.sources.timeline import frame_requests
from mmbatch.types import Request, Sampling

pytestmark = pytest.mark.slow

SAMPLING = Sampling(max_tokens=6)
TINY_ARGS = ["--engine-arg", "dtype=float32", "--engine-arg", "enforce_eager=true"]


def run_rows(engine, requests: list[Request], options: MediaOptions) -> dict:  # type: ignore[no-untyped-def, type-arg]
    sink = MemorySink()
    run_requests(requests, engine, options, sink, SAMPLING, RunConfig(progress=False))
    return {row["id"]: row for row in sink.rows}


def test_each_frame_row_has_the_text_that_frame_gets_alone(
    vl_engine,  # type: ignore[no-untyped-def]
    samples: Path,
    tmp_path: Path,
) -> None:
    other = cfr_video(tmp_path / "other.mp4", frames=40, size=(80, 60))
    options = VideoOptions(sampling="fps", fps=2)
    requests = frame_requests([str(samples / "clip.mp4"), str(other)], options, "What is here?")
    budget = vl_engine.prompt_limits()
    batched = run_rows(vl_engine, requests, MediaOptions(video=options))
    assert len(batched) == len(requests) == 4 + 3  # 2 s and 1.6 s at 2 fps
    for request in requests:
        alone = run_rows(vl_engine, [request], MediaOptions(video=options))
        row, solo = batched[request.id], alone[request.id]
        assert row["error"] is None, row
        assert (row["text"], row["output_tokens"]) == (solo["text"], solo["output_tokens"])
        assert row["output_tokens"] > 0
        # The budget's length of this prompt is the one vLLM counted.
        width, height = (96, 64) if row["video"].endswith("clip.mp4") else (80, 60)
        text = budget.text_tokens(None, "What is here?", ("image",))
        assert row["prompt_tokens"] == text + budget.counts.image(width, height).tokens


def cli(*args: str) -> int:
    """The command in this process: an engine with the settings of one an earlier test
    started is that engine (``mmbatch.engine.registry``), and one it starts is kept for the
    next (an in-process engine that closed would take vLLM's global state along)."""
    from mmbatch.cli import main

    return main([*args, "--max-tokens", "6", "--no-progress"])


def read_rows(path: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_limit_2_of_a_folder_captions_the_first_2_on_the_tiny_model(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--limit 2`` on vLLM: two of a folder's pictures answered, the first two by name."""
    from PIL import Image

    from mmbatch.cli import main

    folder = tmp_path / "pictures"
    folder.mkdir()
    for n in range(30):
        Image.new("RGB", (8, 8), (8 * n, 0, 0)).save(folder / f"p{n:02d}.png")
    out = tmp_path / "captions.jsonl"
    argv = ["caption", str(folder), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += ["--limit", "2", "--max-tokens", "4", "--no-progress", *TINY_ENGINE_FLAGS]
    assert main(argv) == 0
    rows = read_rows(out)
    assert list(rows) == [str(folder / "p00.png"), str(folder / "p01.png")]
    assert all(row["error"] is None and row["output_tokens"] > 0 for row in rows.values())
    assert "--limit 2: the first 2 of 30 items" in capsys.readouterr().err


def test_frames_cli_rows_and_saved_frames(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``mmbatch frames`` in this process, with the session engine's settings: the command
    gets that engine from the registry rather than starting one."""
    from mmbatch.cli import main

    clip = str(samples / "clip.mp4")
    no_video = write_audio(tmp_path / "speech.mp4", codec="aac", rate=16000, layout="mono")
    out = tmp_path / "frames.jsonl"
    argv = ["frames", clip, str(no_video), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += ["--num-frames", "3", "--save-frames", str(tmp_path / "jpg"), "--max-tokens", "6"]
    argv += ["--no-progress", *TINY_ENGINE_FLAGS]
    assert main(argv) == 1  # the audio-only file failed
    stderr = capsys.readouterr().err
    assert "already running (started for an earlier job)" in stderr  # the session's engine
    rows = read_rows(out)
    assert rows[str(no_video)]["error"]["message"] == "no video stream (streams: audio)"
    frames = [r for r in rows.values() if r["error"] is None]
    assert [(r["frame_index"], r["pts"]) for r in frames] == [(8, 0.32), (25, 1.0), (41, 1.64)]
    assert all(r["video"] == clip and r["output_tokens"] > 0 for r in frames)
    assert len(list((tmp_path / "jpg").iterdir())) == 3
    assert "4 of 4 items: 3 ok, 1 failed" in stderr


def test_clip_cli_counts_shrinks_and_refuses_by_the_budget(
    tiny_vl_model: Path, samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(samples / "clip.mp4", tmp_path / "clip.mp4")  # inside the manifest's root
    clip = "clip.mp4"  # 96x64: 2 video tokens per 2 frames
    long_prompt = "Describe every detail of this video, frame by frame, please. " * 4
    manifest = tmp_path / "clips.jsonl"
    manifest.write_text(
        json.dumps({"id": "fits", "path": clip, "prompt": "Describe."})
        + "\n"
        + json.dumps({"id": "too-long", "path": clip, "prompt": long_prompt})
        + "\n"
    )
    budget = budget_for(tiny_vl_model, 1024)
    text = budget.text_tokens(None, "Describe.", ("video",))
    max_model_len = text + 1 + 12  # room for 12 video tokens: 12 frames of this clip
    out = tmp_path / "clips.jsonl.out"
    code = cli(
        "caption", str(manifest), "--as-clip", "--fps", "25", "--min-frames", "4",
        "--model", str(tiny_vl_model), "--out", str(out), *TINY_ARGS,
        "--engine-arg", f"max_model_len={max_model_len}",
    )  # fmt: skip
    assert code == 1, capsys.readouterr().err[-3000:]
    rows = read_rows(out)
    # 50 frames would be 50 tokens: shrunk to the 12 frames that fit, and vLLM agrees.
    assert rows["fits"]["error"] is None, rows["fits"]
    assert rows["fits"]["prompt_tokens"] == text + 12
    assert rows["fits"]["output_tokens"] > 0
    # Even 4 frames leave no room for this prompt: refused before vLLM, saying by how much.
    error = rows["too-long"]["error"]
    assert error["stage"] == "validate"
    assert f"over max_model_len {max_model_len}" in error["message"]


def test_audio_caption_cli_end_to_end(
    tiny_audio_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 8 kHz stereo, 2.5 s, in 1 s windows overlapping by 0.25 s: PyAV makes it 16 kHz mono.
    talk = write_audio(tmp_path / "talk.wav", rate=8000, seconds=2.5, layout="stereo")
    out = tmp_path / "audio.jsonl"
    code = cli(
        "caption", str(talk), "--model", str(tiny_audio_model), "--out", str(out),
        "--prompt", "What is this sound?", "--audio-window", "1", "--audio-overlap", "0.25",
        *TINY_ENGINE_FLAGS,
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err[-3000:]
    rows = sorted(read_rows(out).values(), key=lambda r: r["start"])
    assert [(r["start"], r["end"]) for r in rows] == [(0.0, 1.0), (0.75, 1.75), (1.5, 2.5)]
    max_model_len = TINY_ENGINE_KWARGS["max_model_len"]
    text = budget_for(tiny_audio_model, max_model_len).text_tokens(
        None, "What is this sound?", ("audio",)
    )
    # 1 s at 16 kHz is 25 audio tokens on the tiny Qwen2-Audio.
    assert [r["prompt_tokens"] for r in rows] == [text + 25] * 3
    assert all(r["error"] is None and r["output_tokens"] > 0 for r in rows)


def test_scene_clips_reach_the_model_as_videos_and_resume(
    tiny_vl_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--scenes`` end to end: a row per scene, each its own clip of 4 frames as vLLM
    counts them, and a rerun that finds every clip done."""
    red, green, blue = (200, 30, 30), (30, 200, 30), (30, 30, 200)
    video = scene_video(tmp_path / "scenes.mp4", [(30, red), (20, green), (40, blue)])
    out = tmp_path / "clips.jsonl"
    argv = ["caption", str(video), "--scenes", "--num-frames", "4", "--prompt", "Describe."]
    argv += ["--model", str(tiny_vl_model), "--out", str(out), *TINY_ENGINE_FLAGS]
    assert cli(*argv) == 0, capsys.readouterr().err[-3000:]
    rows = read_rows(out)
    assert [(r["id"], r["start"], r["end"]) for r in rows.values()] == [
        (f"{video}@0.000", 0.0, 1.2),
        (f"{video}@1.200", 1.2, 2.0),
        (f"{video}@2.000", 2.0, 3.6),
    ]
    budget = budget_for(tiny_vl_model, TINY_ENGINE_KWARGS["max_model_len"])
    assert budget.counts is not None
    clip = budget.counts.video(64, 48, 4)
    assert clip is not None
    text = budget.text_tokens(None, "Describe.", ("video",))
    for row in rows.values():
        assert row["error"] is None, row
        assert row["prompt_tokens"] == text + clip.tokens
        assert row["output_tokens"] > 0
    assert len({r["media_hash"] for r in rows.values()}) == 3
    # Again: nothing is left, so no engine is asked for.
    capsys.readouterr()
    assert cli(*argv) == 0
    assert "3 items already have a row; 0 items to do" in capsys.readouterr().err


def test_a_clip_jobs_terminal_holds_mmbatchs_lines_and_its_log_the_libraries(
    tiny_vl_model: Path, samples: Path, tmp_path: Path
) -> None:
    """A clip job as a user runs it, in a process of its own (what reaches its terminal is
    what is tested): transformers' warning on the video processor's pixel cap, said in the
    command's process (the budget asks vLLM's processor) and in the engine's, goes to the
    job's log with vLLM's, as does all that transformers logs at ``TRANSFORMERS_VERBOSITY=info``
    from any thread (the engine process loads the model's processor on a thread of its own);
    the terminal holds mmbatch's lines, and ``--json`` puts the summary's object alone on
    stdout."""
    import os
    import subprocess
    import sys

    out = tmp_path / "clips.jsonl"
    argv = ["caption", str(samples / "clip.mp4"), "--clip-seconds", "1", "--num-frames", "2"]
    argv += ["--model", str(tiny_vl_model), "--out", str(out), "--max-tokens", "4"]
    argv += [*TINY_ENGINE_FLAGS, "--json", "--no-progress"]
    env = os.environ | {"TRANSFORMERS_VERBOSITY": "info"}
    done = subprocess.run(
        [sys.executable, "-m", "mmbatch", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # one object, nothing around it
    assert summary == json.loads(Path(f"{out}.summary.json").read_text())
    assert summary["stats"]["ok"] == 2
    assert "cap_pixels_per_frame" not in done.stderr
    for line in done.stderr.splitlines():
        assert line.startswith(("mmbatch: ", *MMBATCH_SUMMARY)), done.stderr[-3000:]
    log = Path(f"{out}.vllm.log").read_text()
    assert "cap_pixels_per_frame" in log
    assert "[transformers] loading configuration file" in log  # the engine process's thread


MMBATCH_SUMMARY = (
    "2 of 2 items",
    "tokens:",
    "time:",
    "speed:",
    "media:",
    "repeats:",
    "engine queue",
    "rows written to",
    "note:",
)
"""How each line of a job's summary starts (``JobStats.summary``, ``JobReport.lines``)."""
