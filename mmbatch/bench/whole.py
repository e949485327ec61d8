"""Whole processes, timed as a user times them (``mmbatch bench --whole 2000,32``).

The workloads time an engine that is already up; a user waits for the whole command: the
imports, the engine's start, the work and the exit. Here ``mmbatch caption FOLDER`` and the
naive script (``naive_job.py``: ``LLM.chat`` over PIL pictures) each run as a process of
their own on the same pictures (the first N of W1's), with the same sampling, from the
process's start to its exit; each run's time is split into start-up (to the engine ready),
work and exit (from the last row written). Runs alternate their order, so that neither side
always goes first on a host whose compile cache the first run fills.

The datasets sides (``--modes ds-naive,ds-map,ds-pipelined,ds-whole``) time the same
pictures as a Hugging Face ``imagefolder``: a naive ``Dataset.map`` whose function calls
``LLM.chat`` (``datasets_naive.py``) against ``ds.map(DatasetMap(...))``, its ``pipelined``
twin and ``run_dataset`` (``datasets_job.py``). Their ratios are against ``ds-naive``; the
folder's datasets cache is built before any of them is timed, as a user's would be.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mmbatch.bench.sides import run_side, side_environment, side_spec_for
from mmbatch.bench.workloads import CAPTION
from mmbatch.output.paths import OutputPaths

NAIVE_JOB = Path(__file__).with_name("naive_job.py")
DATASETS_NAIVE_JOB = Path(__file__).with_name("datasets_naive.py")
DATASETS_MODES = {
    "ds-naive": "naive",
    "ds-map": "map",
    "ds-pipelined": "pipelined",
    "ds-whole": "whole",
}
"""The datasets sides, and each one's face (``datasets_job.FACES``; naive: the script)."""
MAP_BATCH = 512
"""Rows per ``Dataset.map`` batch on the naive and ``DatasetMap`` sides."""


def whole_sampling(spec: dict[str, Any]) -> dict[str, Any]:
    """The sampling of both sides, as the command line states it: the workloads' settings
    without ``ignore_eos`` and a seed, which ``mmbatch caption`` does not take."""
    from mmbatch.bench.worker import sampling_settings

    left_out = ("seed", "ignore_eos")
    return {k: v for k, v in sampling_settings(spec).items() if k not in left_out}


def run_whole(
    options: dict[str, Any], spec: dict[str, Any], images: list[str], work: Path
) -> list[dict[str, Any]]:
    """Every whole-process run ``options["whole"]`` asks for: each picture count, each mode
    but ``prebuilt``, ``options["whole_repeats"]`` times, the order reversed from one count
    or repeat to the next."""
    modes = [m for m in options["modes"] if m != "prebuilt"]
    entries = []
    for n, count in enumerate(options["whole"]):
        folder = _pictures(work / f"whole-{count}", images[:count])
        if any(mode in DATASETS_MODES for mode in modes):
            _build_imagefolder(folder)
        for repeat in range(options["whole_repeats"]):
            for mode in modes if (n + repeat) % 2 == 0 else modes[::-1]:
                variant = options["variants"].get(mode, {})
                side = {**side_spec_for(spec, mode, variant), "whole_mode": mode}
                out = work / f"whole-{count}-{mode}-{repeat}.jsonl"
                print(f"bench: whole process, {count} pictures, {mode}", file=sys.stderr)
                entry = _timed(side, folder, out, side_environment(variant))
                entries.append({"images": count, "mode": mode, "repeat": repeat, **entry})
    return entries


def whole_ratios(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Per picture count, each mode's mean wall time against its base's (naive's; for a
    datasets side, ds-naive's), as a speed ratio (``ratio_MODE_over_BASE_N``: above 1,
    faster than the base)."""
    means: dict[tuple[int, str], list[float]] = {}
    for e in entries:
        means.setdefault((e["images"], e["mode"]), []).append(e["wall_s"])
    ratios = {}
    for (count, mode), walls in sorted(means.items()):
        name = "ds-naive" if mode in DATASETS_MODES else "naive"
        base = means.get((count, name))
        if base and mode != name:
            ratio = (sum(base) / len(base)) / (sum(walls) / len(walls))
            ratios[f"ratio_{mode}_over_{name}_{count}"] = ratio
    return ratios


def _timed(side: dict[str, Any], folder: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    for stale in out.parent.glob(out.name + "*"):
        stale.unlink()
    log = out.with_name(out.name + ".log")
    face = DATASETS_MODES.get(side["whole_mode"])
    naive = side["mode"] == "naive" and face is None
    if face is not None:
        argv = _datasets_argv(side, face, folder, out)
    else:
        argv = _naive_argv(side, folder, out) if naive else _mmbatch_argv(side, folder, out)
    began = time.time()
    run_side(argv, env, log)
    wall = time.time() - began
    rows = out.read_bytes().count(b"\n")
    if face is not None:
        times = json.loads(out.with_name(out.name + ".times.json").read_text())
        ready = _engine_ready(times)
        startup, work = ready - began, times["done"] - ready
        failed = sum(1 for line in out.read_text().splitlines() if json.loads(line).get("error"))
        phases = {k: round(v - began, 2) for k, v in times.items() if k not in ("done",)}
    elif naive:
        times = json.loads(out.with_name(out.name + ".times.json").read_text())
        startup, work = times["engine_ready"] - began, times["done"] - times["engine_ready"]
        failed, phases = 0, {"vllm_imported": round(times["vllm_imported"] - began, 2)}
    else:
        stats = json.loads(OutputPaths(out).summary.read_text())["stats"]
        startup, work = (
            stats["startup_seconds"],
            stats["process_seconds"] - stats["startup_seconds"],
        )
        failed, phases = stats["failed"], stats["startup_phases"]
    return {
        "side": side["mode"],
        "wall_s": round(wall, 2),
        "startup_s": round(startup, 2),
        "work_s": round(work, 2),
        "exit_s": round(wall - startup - work, 2),
        "rows": rows,
        "failed": failed,
        "startup_phases": phases,
        "log": str(log),
    }


def _naive_argv(side: dict[str, Any], folder: Path, out: Path) -> list[str]:
    settings = {
        "model": side["model"],
        "engine": {"disable_log_stats": False, **side["common_engine_args"]},
        "sampling": whole_sampling(side),
        "prompt": CAPTION,
    }
    return [sys.executable, str(NAIVE_JOB), str(folder), str(out), json.dumps(settings)]


def _mmbatch_argv(side: dict[str, Any], folder: Path, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "mmbatch", "caption", str(folder), "--model", side["model"]]
    argv += ["--out", str(out), "--prompt", CAPTION, "--no-progress"]
    for key, value in whole_sampling(side).items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    engine = {**side["common_engine_args"], **side["mmbatch_engine_args"]}
    for key, value in engine.items():
        argv += ["--engine-arg", f"{key}={json.dumps(value)}"]
    if side.get("engines_per_gpu"):
        argv += ["--engines-per-gpu", str(side["engines_per_gpu"])]
    if side.get("gpus"):
        argv += ["--gpus", str(side["gpus"])]
    if side.get("decode_workers") is not None:
        argv += ["--decode-workers", str(side["decode_workers"])]
    return argv


def _datasets_argv(side: dict[str, Any], face: str, folder: Path, out: Path) -> list[str]:
    engine = {**side["common_engine_args"]}
    if face != "naive":
        engine.update(side["mmbatch_engine_args"])
    settings = {
        "model": side["model"],
        "engine": engine,
        "sampling": whole_sampling(side),
        "prompt": CAPTION,
        "batch_size": MAP_BATCH,
    }
    if face == "naive":
        script = [str(DATASETS_NAIVE_JOB)]
    else:
        script = ["-m", "mmbatch.bench.datasets_job", face]
    return [sys.executable, *script, str(folder), str(out), json.dumps(settings)]


def _engine_ready(times: dict[str, float]) -> float:
    """When a datasets side's engine was ready: the naive script's own mark, else the first
    of mmbatch's start-up moments that says so, else its first row."""
    for name in ("engine_ready", "engines_ready", "engine_0_ready", "llm_built", "first_row"):
        if name in times:
            return times[name]
    return times["done"]


def _build_imagefolder(folder: Path) -> None:
    """Build datasets' cache of ``folder`` as an ``imagefolder`` (in ``HF_DATASETS_CACHE``,
    which every side shares), so that no side is timed building it."""
    import datasets

    datasets.load_dataset("imagefolder", data_dir=str(folder), split="train")


def _pictures(folder: Path, images: list[str]) -> Path:
    """A folder holding exactly ``images`` (hard links where the file system allows)."""
    folder.mkdir(parents=True, exist_ok=True)
    for image in images:
        target = folder / Path(image).name
        if not target.exists():
            try:
                os.link(image, target)
            except OSError:
                target.write_bytes(Path(image).read_bytes())
    return folder
