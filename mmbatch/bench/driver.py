"""Run both sides of the benchmark and write the report (see ``mmbatch bench --help``)."""

from __future__ import annotations

import datetime
import json
import platform
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmbatch.bench.flops import minimal_flops
from mmbatch.bench.monitor import gpu_names
from mmbatch.bench.sides import BASE_SIDES, run_side, side_environment, side_spec_for
from mmbatch.bench.workloads import FRAME_FPS, make_images, make_videos
from mmbatch.engine.installed_vllm import vllm_version

PEAK_BF16_FLOPS = 790e12
"""bf16 matrix-product rate measured on an H200 (8192^3, random data)."""


UNFINISHED = "the runs so far: the bench was stopped before its end, or is still running"
"""The report's ``unfinished`` key, in what is saved after each run and gone from the last."""


def run_bench(
    options: dict[str, Any], argv: list[str], save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Every side and whole-process run ``options`` asks for; the report so far goes to
    ``save`` after each, so that a bench cut short (a time limit, Ctrl-C, a lost machine)
    keeps what it measured, marked ``unfinished``. Returns the whole report."""
    work = Path(options["work_dir"] or tempfile.mkdtemp(prefix="mmbatch-bench-"))
    size, seed = options["size"], options["seed"]
    spec = bench_spec(options, work)
    spec["warmup_images"] = [str(p) for p in make_images(work / "warmup", 32, size, seed + 99)]
    sides = {}
    from mmbatch.bench.whole import WHOLE_ONLY_MODES, whole_mode

    # The datasets, batch-file, face and Ray sides, and their variants, have a whole-process
    # form only (``--whole``).
    modes, variants = options["modes"], options["variants"]
    workload_modes = [
        m for m in modes if whole_mode(m, variants.get(m, {})) not in WHOLE_ONLY_MODES
    ]
    for mode in workload_modes if options["workloads"] else []:
        variant = options["variants"].get(mode, {})
        spec_path, result_path = work / f"spec-{mode}.json", work / f"result-{mode}.json"
        if options["reuse"] and result_path.exists():
            print(f"bench: the {mode} side from {result_path}", file=sys.stderr, flush=True)
            sides[mode] = json.loads(result_path.read_text())
            continue
        side_spec = side_spec_for(spec, mode, variant)
        spec_path.write_text(json.dumps(side_spec))
        print(f"bench: running the {mode} side", file=sys.stderr, flush=True)
        run_side(
            [sys.executable, "-m", "mmbatch.bench.worker", str(spec_path), str(result_path)],
            side_environment(variant),
        )
        sides[mode] = json.loads(result_path.read_text())
        save({**_report(options, argv, spec, sides), "unfinished": UNFINISHED})
    report = _report(options, argv, spec, sides)
    if options.get("whole"):
        from mmbatch.bench.whole import run_whole, whole_ratios

        def with_whole(runs: list[dict[str, Any]]) -> dict[str, Any]:
            return {**report, "whole_process": {"runs": runs, **whole_ratios(runs)}}

        count = max(options["whole"])
        images = [str(p) for p in make_images(work / "whole-source", count, size, seed + 7)]
        runs = run_whole(
            options,
            spec,
            images,
            work,
            lambda so_far: save({**with_whole(so_far), "unfinished": UNFINISHED}),
        )
        report = with_whole(runs)
    return report


def bench_spec(options: dict[str, Any], work: Path) -> dict[str, Any]:
    """What every side runs: the model, each workload's media (made in ``work``), the
    sampling (``sampling_settings`` of it, on every side alike) and the engine settings."""
    return {
        "model": options["model"],
        "workloads": options["workloads"],
        "media": _media(work, options),
        "max_tokens": options["max_tokens"],
        "temperature": options["temperature"],
        "top_p": 0.9,
        "seed": options["seed"],
        "video_seconds": options["video_seconds"],
        "decode_workers": options["decode_workers"],
        "common_engine_args": options["common_engine_args"],
        "mmbatch_engine_args": options["mmbatch_engine_args"],
    }


def sampling_text(spec: dict[str, Any]) -> str:
    """The report's words for the sampling of every side (``worker.sampling_settings``).
    Greedy, or (as here) seeded, mmbatch answers identical requests once (W4's repeats,
    ``mmbatch.repeats``); the baselines decode each."""
    return (
        f"temperature {spec['temperature']:g}, top_p {spec['top_p']:g}, top_k 0, min_p 0, "
        f"repetition_penalty 1.0, seed {spec['seed']}, ignore_eos (the model's "
        "generation_config overridden on every side)"
    )


def ratios(entry: dict[str, Any], sides: dict[str, str]) -> dict[str, float]:
    """Each side's requests/s over each baseline's (``sides``: each mode's side), as
    ``ratio_MODE_over_BASE``: over plain naive, every other side; over another baseline
    (prebuilt, a naive variant), the sides that are not baselines."""
    bases = [m for m in entry if sides[m] in BASE_SIDES]
    return {
        f"ratio_{mode}_over_{base}": entry[mode]["requests_per_s"] / entry[base]["requests_per_s"]
        for base in bases
        for mode in entry
        if mode != base and (base == "naive" or mode not in bases)
    }


def _media(work: Path, options: dict[str, Any]) -> dict[str, list[str]]:
    """Each workload's own media, so that no side profits from caches of the one before."""
    size, seed = options["size"], options["seed"]
    # W4 has as many rows as W1: at 500 (W2's images) every row fits one batch of the engine,
    # which measures one wave's 128 steps, not a rate (an H200, 2026-12-02: 500 rows took
    # 8.3 s naive and 8.4 s on mmbatch).
    counts = {"W1": options["w1_images"], "W2": options["images"], "W4": options["w1_images"]}
    media: dict[str, list[str]] = {}
    for n, workload in enumerate(options["workloads"]):
        folder = work / workload
        if workload == "W3":
            paths = make_videos(folder, options["videos"], options["video_seconds"], size, seed + n)
        else:
            paths = make_images(folder, counts[workload], size, seed + n)
        media[workload] = [str(p) for p in paths]
    return media


def _report(
    options: dict[str, Any], argv: list[str], spec: dict[str, Any], sides: dict[str, Any]
) -> dict[str, Any]:
    config = json.loads((Path(options["model"]) / "config.json").read_text())
    prefix_tokens = _image_prefix_tokens(config, options["size"])
    workloads: dict[str, Any] = {}
    for workload in options["workloads"]:
        entry: dict[str, Any] = {}
        for mode, side in sides.items():
            r = dict(side["workloads"][workload])
            wall = r["wall_s"]
            r["requests_per_s"] = r["requests"] / wall
            r["images_per_s"] = r["images"] / wall
            r["output_tok_per_s"] = r["output_tokens"] / wall
            flops = minimal_flops(
                config,
                distinct_images=r["distinct_images"],
                requests=r["requests"],
                image_size=(options["size"], options["size"]),
                prefix_tokens=prefix_tokens,
                mean_prompt_tokens=r["prompt_tokens"] / r["requests"],
                mean_output_tokens=r["output_tokens"] / r["requests"],
            )
            r["minimal_tflops"] = flops / 1e12
            r["compute_bound_images_per_s"] = r["images"] / (flops / PEAK_BF16_FLOPS)
            r["share_of_compute_bound"] = r["images_per_s"] / r["compute_bound_images_per_s"]
            entry[mode] = r
        entry |= ratios(entry, {mode: side["mode"] for mode, side in sides.items()})
        workloads[workload] = entry
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "mmbatch " + shlex.join(argv),
        "machine": _machine(),
        "vllm_version": vllm_version(),  # every side's: they run this interpreter
        "engine_start_s": {mode: side["engine_start_s"] for mode, side in sides.items()},
        "workload_spec": {
            "w1_images": options["w1_images"],
            "images_w2_w4": options["images"],
            "videos": options["videos"],
            "video_seconds": options["video_seconds"],
            "frames_per_second": FRAME_FPS,
            "image_size": options["size"],
            "max_tokens": options["max_tokens"],
            "sampling": sampling_text(spec),
            "common_engine_args": options["common_engine_args"],
            "mmbatch_engine_args": options["mmbatch_engine_args"],
            "decode_workers": options["decode_workers"],
            "variants": options["variants"],
        },
        "flops_model": {
            "peak_bf16_flops": PEAK_BF16_FLOPS,
            "image_prefix_tokens": prefix_tokens,
            "doc": "mmbatch/bench/flops.py: vision once per distinct image, shared prefix once, "
            "each request's suffix and output tokens; 2 FLOPs per MAC of the matmuls",
        },
        "workloads": workloads,
    }


def _image_prefix_tokens(config: dict[str, Any], size: int) -> int:
    """Tokens shared by every prompt over one image: Qwen's template head (system turn and
    the user turn's start, 20 tokens) and the image's tokens with their two delimiters."""
    patch = int(config["vision_config"].get("patch_size", 14))
    merge = int(config["vision_config"].get("spatial_merge_size", 2))
    return 20 + (size // (patch * merge)) ** 2 + 2


def _machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "gpus": gpu_names(),
    }


def table(report: dict[str, Any]) -> str:
    """A short plain-text table of the report."""
    lines = [
        f"{'workload':8} {'side':8} {'req/s':>8} {'img/s':>8} {'out tok/s':>10} "
        f"{'gpu busy':>8} {'prefix hit':>10} {'mm hit':>7} {'of bound':>8} {'core loop':>9}"
    ]
    for run in report.get("whole_process", {}).get("runs", []):
        lines.append(_whole_line(run))
    for key, ratio in report.get("whole_process", {}).items():
        if key.startswith("ratio_"):
            lines.append(f"whole {key.removeprefix('ratio_')} = {ratio:.2f}x")
    for workload, entry in report["workloads"].items():
        for mode, r in entry.items():
            if mode.startswith("ratio_"):
                continue
            lines.append(
                f"{workload:8} {mode:12} {r['requests_per_s']:8.1f} {r['images_per_s']:8.1f} "
                f"{r['output_tok_per_s']:10.0f} {_pct(r['gpu_busy']):>8} "
                f"{_pct(r['prefix_hit_rate']):>10} {_pct(r['mm_hit_rate']):>7} "
                f"{_pct(r['share_of_compute_bound']):>8} {_pct(_core_loop(r)):>9}"
            )
            if r.get("failed"):
                lines.append(
                    f"{workload:8} {mode}: {r['failed']} of {r['requests']} requests FAILED "
                    "(see the log): these numbers are not a measurement"
                )
        for key, ratio in entry.items():
            if key.startswith("ratio_"):
                mode, base = key.removeprefix("ratio_").split("_over_")
                lines.append(f"{workload:8} {mode} / {base} = {ratio:.2f}x")
    return "\n".join(lines)


def _whole_line(run: dict[str, Any]) -> str:
    """A whole-process run in one line: its media, side, time and its time's parts (a
    frames side: the frames it captioned; a kept engine's job: its first request's time and
    the engine's own start; a side that failed: its exit code, log and last line)."""
    media = f"{run['images']:5} pictures" if "images" in run else f"{run['videos']:3} videos"
    failed = run.get("failed_side")
    if failed is not None:
        last = failed["last_lines"][-1] if failed["last_lines"] else ""
        return (
            f"whole {media} {run['mode']:12} FAILED (exit {failed['exit']}; log "
            f"{failed['log']}): {last}"
        )
    split = (
        f"(start-up {run['startup_s']:.1f}, work {run['work_s']:.1f}, exit {run['exit_s']:.1f})"
        if "startup_s" in run
        else "(in all: vLLM's run_batch keeps no clock of its phases)"
    )
    line = f"whole {media} {run['mode']:12} {run['wall_s']:7.1f} s {split}"
    if "frames" in run:
        line += f", {run['frames']} frames"
    if "first_request_s" in run:
        line += (
            f", first request at {run['first_request_s']} s "
            f"(the kept engine started in {run['engine_start_s']:.1f} s)"
        )
    work = run.get("load", {}).get("work", {})
    if work.get("gpu_busy") is not None:
        line += f", GPU {work['gpu_busy']:.0%} busy in its work"
    tokens = run.get("tokens") or {}
    if tokens.get("output_tokens") is not None:
        line += f", tokens {tokens['prompt_tokens']:,} in, {tokens['output_tokens']:,} out"
    return line


def _core_loop(r: dict[str, Any]) -> float | None:
    """How busy vLLM's scheduler loop (its engine core's main thread) kept its CPU over the
    run: near 100%, the loop is the bound."""
    seconds = r.get("cpu_seconds", {}).get("engine_core_main_thread")
    return None if seconds is None else seconds / r["wall_s"]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"
