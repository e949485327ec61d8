"""Peak memory of a caption job over large photos: does the byte budget hold?

    python benchmarks/memory.py --photos 600 --megapixels 6 --out memory.json

Writes ``--photos`` JPEGs of ``--megapixels`` (a smooth gradient under light noise, about
what a camera's file weighs), builds a tiny model unless ``--model`` names one, runs
``mmbatch caption`` over them in a child process, and samples the resident memory of that
process and all its descendants (the engine, the decode workers) every 0.1 s. The same job
over one small photo first gives the baseline (the engine and the interpreters: on vLLM's
CPU build mostly the KV cache, ``VLLM_CPU_KVCACHE_SPACE`` GiB, 4 by default here). The
report gives both peaks, the time, and the command, machine and settings it ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def make_photos(folder: Path, count: int, megapixels: float, seed: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    width = int((megapixels * 1e6 * 4 / 3) ** 0.5)
    height = int(width * 3 / 4)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    paths = []
    for i in range(count):
        path = folder / f"photo{i:04d}.jpg"
        paths.append(path)
        if path.exists():
            continue
        base = np.stack([(x + 7 * i) % 256, (y + 13 * i) % 256, (x + y + i) % 256], axis=-1)
        noise = rng.integers(0, 24, (height, width, 3))
        Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(path, quality=90)
    return paths


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent = int(fields.get("PPid", "0").strip())
        children.setdefault(parent, []).append(int(entry.name))
        rss[int(entry.name)] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += rss.get(current, 0)
        todo.extend(children.get(current, []))
    return total


def measure(argv: list[str]) -> tuple[int, float, int]:
    """Run ``argv``; its peak tree RSS in bytes, its wall time, its exit code."""
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(child.pid))
        time.sleep(0.1)
    stderr = child.stderr.read().decode() if child.stderr else ""
    if child.returncode not in (0, 1):
        print(stderr[-3000:], file=sys.stderr)
    return peak, time.perf_counter() - started, child.returncode


def caption_command(folder: Path, model: str, work: Path, extra: list[str]) -> list[str]:
    """``mmbatch caption`` over ``folder`` into a fresh output."""
    out = work / "captions.jsonl"
    from mmbatch.output.paths import OutputPaths

    for stale in (out, OutputPaths(out).record):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "mmbatch", "caption", str(folder), "--model", model]
    command += ["--out", str(out), "--max-tokens", "8", "--no-progress"]
    command += ["--engine-arg", "dtype=float32", "--engine-arg", "max_model_len=1024"]
    return command + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/memory.py")
    parser.add_argument("--photos", type=int, default=600)
    parser.add_argument("--megapixels", type=float, default=6.0)
    parser.add_argument("--model", default=None, help="default: a tiny model built here")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("caption_args", nargs="*", help="more `mmbatch caption` arguments")
    args = parser.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mmbatch-memory-"))
    photos = make_photos(work / f"photos-{args.megapixels:g}mp", args.photos, args.megapixels)
    model = args.model
    if model is None:
        from mmbatch.tiny_models import build_tiny_model

        model = str(build_tiny_model(work / "tiny-model", family="qwen2_vl", seed=0))
    # The same job over one small photo: what the engine and the interpreters hold anyway.
    small = make_photos(work / "photos-baseline", 1, 0.05)
    baseline, _, _ = measure(caption_command(small[0].parent, model, work, args.caption_args))
    command = caption_command(photos[0].parent, model, work, args.caption_args)
    peak, wall, code = measure(command)
    report: dict[str, Any] = {
        "command": "python benchmarks/memory.py " + " ".join(argv or sys.argv[1:]),
        "job": command[2:],
        "machine": {"host": platform.node(), "cpus": os.cpu_count()},
        "photos": args.photos,
        "megapixels": args.megapixels,
        "photo_bytes": sum(p.stat().st_size for p in photos),
        "peak_rss_bytes": peak,
        "peak_rss_gib": round(peak / 1024**3, 2),
        "baseline_rss_gib": round(baseline / 1024**3, 2),
        "above_baseline_gib": round((peak - baseline) / 1024**3, 2),
        "vllm_cpu_kvcache_space": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "wall_s": round(wall, 1),
        "exit_code": code,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
