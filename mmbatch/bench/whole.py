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

The batch-file sides (``--modes vllm-run-batch,openai-batch``, and their ``-x4`` forms) time
the same pictures as an OpenAI batch file of one line per picture (``-x4``: four prompts per
picture, prompt-major, as W2): vLLM's own ``python -m vllm.entrypoints.openai.run_batch``
against ``mmbatch run-openai-batch`` on the same file. Their ratios are against vLLM's.

The faces' sides (``--modes run,frames,frames-naive,kept``, ``mmbatch.bench.faces``) time
``mmbatch run`` against naive, ``mmbatch frames`` over W3's videos against a naive PyAV
script, and a job on a kept engine (``mmbatch caption --engine``) against ``mmbatch``.

The Ray sides (``--modes ray,ray-data-llm``) time the same pictures on a one-node Ray each
starts for itself: ``mmbatch caption FOLDER --ray local`` (its output a folder) against the
job as Ray Data LLM's documentation writes it (``ray_data_llm_job.py``:
``vLLMEngineProcessorConfig`` and ``build_processor`` over ``ray.data.read_images``). Ray
Data LLM's ratio is against naive's; mmbatch's on Ray against Ray Data LLM's, and naive's.

Each mmbatch run's start-up is reported by phase (``startup_phases``, seconds from its
process's start): ``imports_done`` (its arguments read), ``engine_start_begun`` (where the
engine starts while the inputs are read), ``inputs_listed`` (read and parsed),
``engine_processes_spawned``; while the engines start, the job's own checks:
``preflight_passed`` (the settings as vLLM reads them), ``template_read`` (the model's chat
template), ``counts_read`` (vLLM's token counts) and ``settings_checked``; each engine
process's own, as ``engine_N_started``, ``engine_N_vllm_imported``,
``engine_N_template_read`` (read beside the engine's build), ``engine_N_llm_built`` and
``engine_N_ready``; then ``engines_ready``, ``first_request`` (the first handed to the
engine), ``first_row``, ``last_row``, and ``exit`` (the process gone), taken from the job's
own clock (its summary), not from its log. What each side's engines spent their build on,
as vLLM's log says it, is the run's ``engine_log`` (``mmbatch.bench.engine_log``); how busy
the GPUs and the host's CPUs were over its start-up and its work, its ``load``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmbatch.bench.engine_log import engine_log_figures, run_logs
from mmbatch.bench.faces import FACE_BASES, FRAME_MODES, timed_face
from mmbatch.bench.job_process import (
    engine_arg_flags,
    mmbatch_job_argv,
    naive_settings,
    script_times,
    summary_times,
    whole_sampling,
)
from mmbatch.bench.monitor import MachineLoad
from mmbatch.bench.sides import run_side, side_environment, side_spec_for
from mmbatch.bench.workloads import CAPTION, make_videos

NAIVE_JOB = Path(__file__).with_name("naive_job.py")
DATASETS_NAIVE_JOB = Path(__file__).with_name("datasets_naive.py")
DATASETS_MODES = {
    "ds-naive": "naive",
    "ds-map": "map",
    "ds-pipelined": "pipelined",
    "ds-whole": "whole",
}
"""The datasets sides, and each one's face (``datasets_job.FACES``; naive: the script)."""
BATCH_MODES = {
    "vllm-run-batch": ("vllm", 1),
    "vllm-run-batch-x4": ("vllm", 4),
    "openai-batch": ("mmbatch", 1),
    "openai-batch-x4": ("mmbatch", 4),
}
"""The batch-file sides: whose command runs the file, and the prompts per picture in it."""
RAY_MODES = ("ray", "ray-data-llm")
"""The Ray sides: mmbatch's ``--ray`` and Ray Data LLM's own job."""
RAY_DATA_LLM_JOB = Path(__file__).with_name("ray_data_llm_job.py")
RAY_DATA_LLM_BATCH = 128
"""Rows per batch of Ray Data LLM's engine stage, which holds 8 batches at once (its
``max_concurrent_batches``): about the thousand requests mmbatch's replica holds."""
RAY_DATA_LLM_ON_CPUS = {"placement": {"bundles": [{"CPU": 1}]}, "ray_init": {"num_cpus": 8}}
"""Ray Data LLM's settings where vLLM's CPU build runs the engine: its engine's actor on a
CPU (by default it asks for a GPU, and waits for one forever), and CPUs enough for its
stages' actors, one CPU each, on a small host."""
WHOLE_ONLY_MODES = frozenset([*DATASETS_MODES, *BATCH_MODES, *FACE_BASES, *RAY_MODES])
"""The sides that have a whole-process form only (``--whole``)."""
VLLM_RUN_BATCH = "vllm.entrypoints.openai.run_batch"
LOAD_INTERVAL = 0.5
"""Seconds between the machine's load samples over a whole-process run (``run_load``)."""
MAP_BATCH = 512
"""Rows per ``Dataset.map`` batch on the naive and ``DatasetMap`` sides."""


def run_whole(
    options: dict[str, Any],
    spec: dict[str, Any],
    images: list[str],
    work: Path,
    after_each: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Every whole-process run ``options["whole"]`` asks for: each picture count, each mode
    but ``prebuilt``, ``options["whole_repeats"]`` times, the order reversed from one count
    or repeat to the next; the frames sides once per repeat, over W3's videos. The runs so
    far go to ``after_each`` after each run."""
    over_videos = {
        m for m in options["modes"] if whole_mode(m, options["variants"].get(m, {})) in FRAME_MODES
    }
    modes = [m for m in options["modes"] if m != "prebuilt" and m not in over_videos]
    entries = []
    for n, count in enumerate(options["whole"]):
        folder = _pictures(work / f"whole-{count}", images[:count])
        if any(mode in DATASETS_MODES for mode in modes):
            _build_imagefolder(folder)
        for repeat in range(options["whole_repeats"]):
            for mode in modes if (n + repeat) % 2 == 0 else modes[::-1]:
                out = work / f"whole-{count}-{mode}-{repeat}.jsonl"
                print(f"bench: whole process, {count} pictures, {mode}", file=sys.stderr)
                entry = _side_run(options, spec, mode, folder, out)
                entries.append({"images": count, "mode": mode, "repeat": repeat, **entry})
                after_each(entries)
    frame_modes = [m for m in options["modes"] if m in over_videos]
    if frame_modes:
        _frame_runs(options, spec, frame_modes, work, entries, after_each)
    return entries


def _frame_runs(
    options: dict[str, Any],
    spec: dict[str, Any],
    modes: list[str],
    work: Path,
    entries: list[dict[str, Any]],
    after_each: Callable[[list[dict[str, Any]]], None],
) -> None:
    """The frames sides' runs over W3's videos (``--videos`` of ``--video-seconds``), each
    ``options["whole_repeats"]`` times, the order reversed from one repeat to the next,
    added to ``entries`` (then given to ``after_each``) one by one."""
    folder = work / "whole-videos"
    count, seconds, size = options["videos"], options["video_seconds"], options["size"]
    make_videos(folder, count, seconds, size, options["seed"] + 3)
    for repeat in range(options["whole_repeats"]):
        for mode in modes if repeat % 2 == 0 else modes[::-1]:
            out = work / f"whole-videos-{mode}-{repeat}.jsonl"
            print(f"bench: whole process, {count} videos, {mode}", file=sys.stderr)
            entry = _side_run(options, spec, mode, folder, out)
            entries.append({"videos": count, "mode": mode, "repeat": repeat, **entry})
            after_each(entries)


def _side_run(
    options: dict[str, Any], spec: dict[str, Any], mode: str, media: Path, out: Path
) -> dict[str, Any]:
    """One timed run of the side ``mode`` (with its variant's settings) over ``media``; a
    side whose process fails is said as such (``failed_side``), and the bench goes on."""
    variant = options["variants"].get(mode, {})
    side = {**side_spec_for(spec, mode, variant), "whole_mode": whole_mode(mode, variant)}
    with MachineLoad(interval=LOAD_INTERVAL) as load:
        try:
            entry = _timed(side, media, out, side_environment(variant))
        except subprocess.CalledProcessError as exc:
            return failed_side(exc, out)
        ended = time.time()
    # The process ran for wall_s up to about ``ended``: its outputs are read in milliseconds.
    entry = {**entry, "load": run_load(load, ended - entry["wall_s"], entry)}
    figures = engine_log_figures(run_logs(out))
    return {**entry, "engine_log": figures} if figures else entry


def run_load(load: MachineLoad, began: float, run: dict[str, Any]) -> dict[str, Any]:
    """The machine's load over a whole-process ``run`` that began at ``began`` (the wall
    clock): the GPUs' busy share and the host's CPU busy share over the whole run, and over
    its start-up and its work where the run splits its time (vLLM's ``run_batch`` does not).
    A GPU idle in the work says the engine was not fed; a host CPU busy through the start-up
    says what the imports and the builds of several processes at once contend for."""
    spans = {"whole": (0.0, run["wall_s"])}
    if "startup_s" in run:
        spans["startup"] = (0.0, run["startup_s"])
        spans["work"] = (run["startup_s"], run["startup_s"] + run["work_s"])
    return {name: load.shares_between(began + a, began + b) for name, (a, b) in spans.items()}


def whole_mode(mode: str, variant: dict[str, Any]) -> str:
    """The whole-process side that ``mode`` runs: a variant of a whole-process side (``{"side":
    "ray", "ray_batch": 512}``) runs as that side, with the variant's settings."""
    side = variant.get("side")
    return side if side in WHOLE_ONLY_MODES else mode


FAILED_SIDE_LINES = 12
"""The last lines of a failed side's log that its run's entry keeps."""


def failed_side(exc: subprocess.CalledProcessError, out: Path) -> dict[str, Any]:
    """The entry of a side whose process ended with an error: its exit code, its log and
    the log's last lines. Its run has no time, so no ratio counts it; the sides after it
    still run (one side that cannot run on a host, another library's say, must not cost the
    measurements of the others)."""
    lines = (exc.output or "").splitlines()[-FAILED_SIDE_LINES:]
    log = out.with_name(out.name + ".log")
    return {"failed_side": {"exit": exc.returncode, "log": str(log), "last_lines": lines}}


def clear_earlier_run(out: Path) -> None:
    """Remove what an earlier run of the same side left in the work folder for ``out``
    (``NAME.jsonl``): its rows, summary and logs, and a Ray run's folder ``NAME`` with the
    files beside it (``NAME.vllm.log``...). Left there, rows would be resumed, not run
    again, and an old log read as the new run's."""
    stem = out.name.removesuffix(".jsonl")
    for stale in [*out.parent.glob(stem), *out.parent.glob(f"{stem}.*")]:
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()


def whole_ratios(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Per picture count, each mode's mean wall time against its base's (naive's; for a
    datasets side, ds-naive's; ``_base_of``), as a speed ratio (``ratio_MODE_over_BASE_N``:
    above 1, faster than the base; the frames sides' N is their videos, as ``10videos``)."""
    means: dict[tuple[str, str], list[float]] = {}
    for e in entries:
        if "failed_side" in e:
            continue
        scale = str(e["images"]) if "images" in e else f"{e['videos']}videos"
        means.setdefault((scale, e["mode"]), []).append(e["wall_s"])
    ratios = {}
    for (count, mode), walls in sorted(means.items()):
        for name in _bases_of(mode):
            base = means.get((count, name))
            if base and mode != name:
                ratio = (sum(base) / len(base)) / (sum(walls) / len(walls))
                ratios[f"ratio_{mode}_over_{name}_{count}"] = ratio
    return ratios


def _bases_of(mode: str) -> tuple[str, ...]:
    """The sides ``mode`` is measured against."""
    if mode in DATASETS_MODES:
        return ("ds-naive",)
    if mode in BATCH_MODES:
        return ("vllm-run-batch" + ("-x4" if BATCH_MODES[mode][1] == 4 else ""),)
    if mode == "ray":
        return ("ray-data-llm", "naive")
    return (FACE_BASES.get(mode, "naive"),)


def _timed(side: dict[str, Any], folder: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    clear_earlier_run(out)
    log = out.with_name(out.name + ".log")
    if side["whole_mode"] in BATCH_MODES:
        return _timed_batch(side, folder, out, env, log)
    if side["whole_mode"] in FACE_BASES:
        return timed_face(side, folder, out, env, log)
    if side["whole_mode"] in RAY_MODES:
        return _timed_ray(side, folder, out, env, log)
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
    entry = {"side": side["mode"], "wall_s": round(wall, 2), "rows": rows, "log": str(log)}
    if face is None:
        timing = script_times(out, began, wall) if naive else summary_times(out, wall)
        return {**entry, **timing}
    times = json.loads(out.with_name(out.name + ".times.json").read_text())
    ready = _engine_ready(times)
    startup, work = ready - began, times["done"] - ready
    return {
        **entry,
        "startup_s": round(startup, 2),
        "work_s": round(work, 2),
        "exit_s": round(wall - startup - work, 2),
        "failed": sum(1 for line in out.read_text().splitlines() if json.loads(line).get("error")),
        "startup_phases": {k: round(v - began, 2) for k, v in times.items() if k != "done"},
    }


def _timed_batch(
    side: dict[str, Any], folder: Path, out: Path, env: dict[str, str], log: Path
) -> dict[str, Any]:
    """A batch-file side's run: vLLM's ``run_batch``, timed whole (its start-up is in its
    log only), or ``mmbatch run-openai-batch``, its phases from its summary."""
    runner, prompts = BATCH_MODES[side["whole_mode"]]
    requests = batch_file(side, folder, prompts)
    vllm = runner == "vllm"
    argv = (
        vllm_run_batch_argv(side, requests, out) if vllm else openai_batch_argv(side, requests, out)
    )
    began = time.time()
    run_side(argv, env, log)
    wall = time.time() - began
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    failed = sum(1 for line in lines if line.get("error") or line["response"]["status_code"] != 200)
    entry: dict[str, Any] = {"side": runner, "wall_s": round(wall, 2), "rows": len(lines)}
    if vllm:
        return {
            **entry,
            "failed": failed,
            "startup_phases": {"exit": round(wall, 2)},
            "log": str(log),
        }
    return {**entry, **summary_times(out, wall), "failed": failed, "log": str(log)}


def _timed_ray(
    side: dict[str, Any], folder: Path, out: Path, env: dict[str, str], log: Path
) -> dict[str, Any]:
    """A Ray side's run: ``mmbatch caption --ray local`` into a folder, its phases from its
    summary (its replicas' among them), or Ray Data LLM's job, its start-up up to its first
    row (the first moment at which it can tell that its engine is up)."""
    mmbatch = side["whole_mode"] == "ray"
    target = out.with_suffix("") if mmbatch else out
    argv = ray_argv(side, folder, target) if mmbatch else ray_data_llm_argv(side, folder, out)
    began = time.time()
    run_side(argv, env, log)
    wall = time.time() - began
    files = sorted(target.glob("[!.]*")) if mmbatch else [out]
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]
    entry: dict[str, Any] = {"side": side["whole_mode"], "wall_s": round(wall, 2)}
    entry |= {"rows": len(lines), "log": str(log)}
    if mmbatch:
        return {**entry, **summary_times(target, wall)}
    times = json.loads(out.with_name(out.name + ".times.json").read_text())
    startup, work = times["first_row"] - began, times["done"] - times["first_row"]
    phases = {k: round(v - began, 2) for k, v in times.items()} | {"exit": round(wall, 2)}
    return {
        **entry,
        "startup_s": round(startup, 2),
        "work_s": round(work, 2),
        "exit_s": round(wall - startup - work, 2),
        "failed": sum(1 for line in lines if line.get("error")),
        "startup_phases": phases,
    }


def ray_argv(side: dict[str, Any], folder: Path, out: Path) -> list[str]:
    """``mmbatch caption`` as the mmbatch side runs it, on a one-node Ray of its own, one
    replica, into the folder ``out``; a variant's ``ray_batch``: its pictures per actor batch."""
    batch = ["--ray-batch", str(side["ray_batch"])] if side.get("ray_batch") else []
    return [*_mmbatch_argv(side, folder, out), "--ray", "local", "--replicas", "1", *batch]


def ray_data_llm_argv(
    side: dict[str, Any], folder: Path, out: Path, on_cpus: bool | None = None
) -> list[str]:
    """Ray Data LLM's job (``ray_data_llm_job.py``) with the sides' common engine arguments
    and sampling; ``on_cpus`` (None: where vLLM's CPU build is installed) adds its settings
    for an engine on CPUs."""
    if on_cpus is None:
        from mmbatch.engine.installed_vllm import cpu_build

        on_cpus = cpu_build()
    settings = {
        "model": side["model"],
        "engine": {"disable_log_stats": False, **side["common_engine_args"]},
        "sampling": whole_sampling(side),
        "prompt": CAPTION,
        "batch_size": RAY_DATA_LLM_BATCH,
        **(RAY_DATA_LLM_ON_CPUS if on_cpus else {}),
    }
    return [sys.executable, str(RAY_DATA_LLM_JOB), str(folder), str(out), json.dumps(settings)]


def batch_file(side: dict[str, Any], folder: Path, prompts: int) -> Path:
    """An OpenAI batch file over the pictures of ``folder``: one line per picture and
    prompt (``prompts`` 1: the caption prompt; 4: W2's prompts, prompt-major), each with
    the sides' sampling, its picture a ``file://`` URL inside ``folder``."""
    from mmbatch.bench.workloads import W2_PROMPTS

    texts = [CAPTION] if prompts == 1 else list(W2_PROMPTS[:prompts])
    pictures = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    path = folder.with_name(f"{folder.name}-batch-x{prompts}.jsonl")
    with open(path, "w") as file:
        for t, text in enumerate(texts):
            for picture in pictures:
                content = [
                    {"type": "image_url", "image_url": {"url": picture.resolve().as_uri()}},
                    {"type": "text", "text": text},
                ]
                body = {
                    "model": side["model"],
                    "messages": [{"role": "user", "content": content}],
                    **whole_sampling(side),
                }
                line = {
                    "custom_id": f"{picture.stem}-{t}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
                file.write(json.dumps(line) + "\n")
    return path


def vllm_run_batch_argv(side: dict[str, Any], requests: Path, out: Path) -> list[str]:
    """vLLM's own batch runner on ``requests``, with the sides' common engine arguments as
    its flags, its pictures allowed from the file's folder."""
    argv = [sys.executable, "-m", VLLM_RUN_BATCH, "-i", str(requests), "-o", str(out)]
    argv += ["--model", side["model"], "--allowed-local-media-path", str(requests.parent)]
    return argv + engine_flags(side["common_engine_args"])


def openai_batch_argv(side: dict[str, Any], requests: Path, out: Path) -> list[str]:
    """``mmbatch run-openai-batch`` on ``requests``, with mmbatch's engine arguments."""
    argv = [sys.executable, "-m", "mmbatch", "run-openai-batch", str(requests)]
    argv += ["--model", side["model"], "--out", str(out), "--no-progress"]
    return argv + engine_arg_flags(side)


def engine_flags(settings: dict[str, Any]) -> list[str]:
    """Engine arguments as vLLM's command line takes them: ``--max-model-len 4096``, a
    true flag alone, a false one as ``--no-...`` (vLLM's boolean options that default to
    true take that form), a table as JSON."""
    flags: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + flag[2:])
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def _naive_argv(side: dict[str, Any], folder: Path, out: Path) -> list[str]:
    settings = naive_settings(side, CAPTION)
    return [sys.executable, str(NAIVE_JOB), str(folder), str(out), json.dumps(settings)]


def _mmbatch_argv(side: dict[str, Any], folder: Path, out: Path) -> list[str]:
    return mmbatch_job_argv(side, ["caption", str(folder), "--prompt", CAPTION], out)


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
