"""A side of ``mmbatch bench --whole`` as a whole process: an mmbatch command's line (the
sides' sampling, mmbatch's engine arguments and layout) and its time split by phase, read
from the job's own clock (its summary); a naive script's, from the times file it writes.
Every face's side is built from these, so that no two of them differ in what they pass."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mmbatch.output.paths import OutputPaths

SUMMARY_TOKENS = (
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "prefix_cache_hit_rate",
    "mm_cache_hit_rate",
)
"""The token counts and cache hit rates of an mmbatch job's summary that its run keeps."""


def whole_sampling(spec: dict[str, Any]) -> dict[str, Any]:
    """The sampling of every side, as the command line states it: the workloads' settings
    without ``ignore_eos`` and a seed, which mmbatch's commands do not take."""
    from mmbatch.bench.worker import sampling_settings

    left_out = ("seed", "ignore_eos")
    return {k: v for k, v in sampling_settings(spec).items() if k not in left_out}


def mmbatch_job_argv(side: dict[str, Any], face: list[str], out: Path) -> list[str]:
    """``mmbatch FACE... --out OUT`` with the sides' sampling, mmbatch's engine arguments
    and the side's layout (``face``: the command and its inputs, and its own flags)."""
    argv = [sys.executable, "-m", "mmbatch", *face, "--model", side["model"]]
    argv += ["--out", str(out), "--no-progress"]
    for key, value in whole_sampling(side).items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    argv += engine_arg_flags(side)
    if side.get("engines_per_gpu"):
        argv += ["--engines-per-gpu", str(side["engines_per_gpu"])]
    if side.get("gpus"):
        argv += ["--gpus", str(side["gpus"])]
    if side.get("decode_workers") is not None:
        argv += ["--decode-workers", str(side["decode_workers"])]
    return argv


def naive_settings(side: dict[str, Any], prompt: str) -> dict[str, Any]:
    """What a naive script is given: the model, vLLM's engine with the sides' common
    arguments alone (its statistics logged, as ``LLM``'s default leaves them off), the
    sides' sampling and the prompt."""
    return {
        "model": side["model"],
        "engine": {"disable_log_stats": False, **side["common_engine_args"]},
        "sampling": whole_sampling(side),
        "prompt": prompt,
    }


def engine_arg_flags(side: dict[str, Any]) -> list[str]:
    """The sides' common engine arguments and mmbatch's own, as ``--engine-arg`` flags."""
    flags = []
    for key, value in {**side["common_engine_args"], **side["mmbatch_engine_args"]}.items():
        flags += ["--engine-arg", f"{key}={json.dumps(value)}"]
    return flags


def summary_times(out: Path, wall: float) -> dict[str, Any]:
    """An mmbatch job's run, from its summary: start-up (to its engines ready), work, exit
    (from the last row to the process gone, ``wall`` after its start), its failed rows and
    its start-up moments (``startup_phases``, seconds from its process's start), the engine
    layout it chose (``engines``, as its summary says it), and the tokens and cache hits its
    engines reported with how full their queues were (``tokens``, ``engine_queue``): two faces'
    work compares only where these are the same."""
    summary = json.loads(OutputPaths(out).summary.read_text())
    stats = summary["stats"]
    startup, work = stats["startup_seconds"], stats["process_seconds"] - stats["startup_seconds"]
    return {
        "startup_s": round(startup, 2),
        "work_s": round(work, 2),
        "exit_s": round(wall - startup - work, 2),
        "failed": stats["failed"],
        "startup_phases": {**stats["startup_phases"], "exit": round(wall, 2)},
        "engines": summary["job"].get("engines"),
        "tokens": {name: stats.get(name) for name in SUMMARY_TOKENS},
        "engine_queue": stats.get("engine_queue"),
    }


def script_times(out: Path, began: float, wall: float) -> dict[str, Any]:
    """A naive script's run, from the times file it writes beside ``out`` (wall-clock
    ``vllm_imported``, ``engine_ready``, ``done``), its process begun at ``began``."""
    times = json.loads(out.with_name(out.name + ".times.json").read_text())
    startup, work = times["engine_ready"] - began, times["done"] - times["engine_ready"]
    phases = {name: round(times[name] - began, 2) for name in ("vllm_imported", "engine_ready")}
    return {
        "startup_s": round(startup, 2),
        "work_s": round(work, 2),
        "exit_s": round(wall - startup - work, 2),
        "failed": 0,
        "startup_phases": {**phases, "exit": round(wall, 2)},
    }
