"""The whole-process sides of mmbatch's other faces (``mmbatch bench --whole``), each timed
from its command to its exit against the baseline a user of that face would write:

* ``run``: ``mmbatch run RECIPE`` over the pictures, the recipe one question (the caption
  prompt, with no settings of its own: the sampling and engine arguments are the command
  line's, as on the ``mmbatch`` side), against ``naive``: a row per picture on each side,
  the picture's file name in its id.
* ``frames`` and ``frames-naive``: W3's videos sampled at ``FRAME_FPS`` at their own size,
  every frame captioned: ``mmbatch frames VIDEOS --fps 1`` against ``frames_naive.py``
  (PyAV, then ``LLM.chat`` a batch at a time). Both take a frame per second of video, so
  the same number from each; each run says how many it captioned (``frames``).
* ``kept``: ``mmbatch caption --engine NAME`` on an engine that ``mmbatch engine start``
  started beforehand with the sides' engine arguments (its start timed apart, as
  ``engine_start_s``; the engine stopped after the run, failed or not), against the
  ``mmbatch`` side, which starts its own engine. ``first_request_s``: from the command's
  start to its first request handed to the engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mmbatch.bench.job_process import (
    engine_arg_flags,
    mmbatch_job_argv,
    naive_settings,
    script_times,
    summary_times,
)
from mmbatch.bench.sides import run_side
from mmbatch.bench.workloads import CAPTION, FRAME_FPS, FRAME_PROMPT
from mmbatch.engine.kept_folder import FOLDER_ENV, EngineFiles

FRAMES_NAIVE_JOB = Path(__file__).with_name("frames_naive.py")
FACE_BASES = {
    "run": "naive",
    "frames": "frames-naive",
    "frames-naive": "frames-naive",
    "kept": "mmbatch",
}
"""The faces' sides, and the side each is measured against."""
FRAME_MODES = frozenset({"frames", "frames-naive"})
"""The sides that caption W3's videos rather than the pictures."""
FRAMES_BATCH = 256
"""Frames per ``LLM.chat`` call of the naive frames script."""
KEPT_ENGINE_NAME = "bench-kept"


def timed_face(
    side: dict[str, Any], media: Path, out: Path, env: dict[str, str], log: Path
) -> dict[str, Any]:
    """One run of the face side ``side["whole_mode"]`` over ``media`` (the pictures' folder,
    or the videos'), its rows to ``out`` and its output to ``log``."""
    mode = side["whole_mode"]
    if mode == "kept":
        return _timed_kept(side, media, out, env, log)
    if mode == "frames-naive":
        argv = frames_naive_argv(side, media, out)
    elif mode == "frames":
        argv = frames_argv(side, media, out)
    else:
        argv = run_argv(side, recipe_file(media), media, out)
    began = time.time()
    run_side(argv, env, log)
    wall = time.time() - began
    rows = out.read_bytes().count(b"\n")
    timing = script_times(out, began, wall) if mode == "frames-naive" else summary_times(out, wall)
    entry = {"side": "naive" if mode == "frames-naive" else "mmbatch", "wall_s": round(wall, 2)}
    if mode in FRAME_MODES:
        entry["frames"] = rows
    return {**entry, **timing, "rows": rows, "log": str(log)}


def recipe_file(folder: Path) -> Path:
    """A recipe beside ``folder`` asking the caption prompt of each picture, and nothing
    else: ``mmbatch run`` then does what ``mmbatch caption --prompt`` does."""
    path = folder.with_name(f"{folder.name}-caption.toml")
    lines = ['name = "bench-caption"', "", "[prompt]", f"text = {json.dumps(CAPTION)}", ""]
    lines += ["[media]", 'kind = "image"', "", "[output]", 'format = "text"', ""]
    path.write_text("\n".join(lines))
    return path


def run_argv(side: dict[str, Any], recipe: Path, folder: Path, out: Path) -> list[str]:
    """``mmbatch run RECIPE FOLDER`` with the sides' sampling and engine arguments."""
    return mmbatch_job_argv(side, ["run", str(recipe), str(folder)], out)


def frames_argv(side: dict[str, Any], videos: Path, out: Path) -> list[str]:
    """``mmbatch frames VIDEOS --fps 1`` with the frame prompt, the sampling and engine
    arguments of every side."""
    face = ["frames", str(videos), "--fps", f"{FRAME_FPS:g}", "--prompt", FRAME_PROMPT]
    return mmbatch_job_argv(side, face, out)


def frames_naive_argv(side: dict[str, Any], videos: Path, out: Path) -> list[str]:
    """The naive frames script on ``videos``, with the sides' common engine arguments."""
    settings = {**naive_settings(side, FRAME_PROMPT), "fps": FRAME_FPS, "batch_size": FRAMES_BATCH}
    return [sys.executable, str(FRAMES_NAIVE_JOB), str(videos), str(out), json.dumps(settings)]


def kept_start_argv(side: dict[str, Any], name: str) -> list[str]:
    """``mmbatch engine start MODEL --name NAME`` with the engine arguments and layout the
    ``mmbatch`` side's job asks for, so that the job runs on it unrefused."""
    argv = [sys.executable, "-m", "mmbatch", "engine", "start", side["model"], "--name", name]
    argv += engine_arg_flags(side)
    if side.get("engines_per_gpu"):
        argv += ["--engines-per-gpu", str(side["engines_per_gpu"])]
    if side.get("gpus"):
        argv += ["--gpus", str(side["gpus"])]
    return argv


def kept_job_argv(side: dict[str, Any], name: str, folder: Path, out: Path) -> list[str]:
    """``mmbatch caption FOLDER --engine NAME``, otherwise the ``mmbatch`` side's command."""
    face = ["caption", str(folder), "--prompt", CAPTION, "--engine", name]
    return mmbatch_job_argv(side, face, out)


def _timed_kept(
    side: dict[str, Any], folder: Path, out: Path, env: dict[str, str], log: Path
) -> dict[str, Any]:
    """The kept engine's run: started (timed apart) in an engines folder of this run's own,
    the job timed whole, the engine stopped whatever happened (its log kept beside the
    job's, as ``LOG.engine``; the start command's as ``LOG.engine-start``)."""
    with tempfile.TemporaryDirectory(prefix="mmbatch-engines-") as engines:  # 0700
        env = {**env, FOLDER_ENV: engines}
        files = EngineFiles(Path(engines), KEPT_ENGINE_NAME)
        try:
            began = time.time()
            run_side(
                kept_start_argv(side, files.name), env, log.with_name(log.name + ".engine-start")
            )
            engine_start = time.time() - began
            pid = (files.read_info() or {}).get("pid")
            began = time.time()
            run_side(kept_job_argv(side, files.name, folder, out), env, log)
            wall = time.time() - began
        finally:
            stop = [sys.executable, "-m", "mmbatch", "engine", "stop", files.name]
            subprocess.run(stop, env=env, capture_output=True, check=False)
            if files.log.exists():
                shutil.copyfile(files.log, log.with_name(log.name + ".engine"))
    timing = summary_times(out, wall)
    return {
        "side": "mmbatch",
        "wall_s": round(wall, 2),
        **timing,
        "rows": out.read_bytes().count(b"\n"),
        "engine_start_s": round(engine_start, 2),
        "first_request_s": timing["startup_phases"].get("first_request"),
        "engine_pid": pid,
        "log": str(log),
    }
