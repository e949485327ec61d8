"""Kills on a real host: an engine process killed mid-job, then the job itself.

``python benchmarks/kill_check.py --model M --images 2000 --out REPORT.json -- [caption
flags]`` runs ``mmbatch caption`` on W1-like pictures three times:

1. **an engine killed**: once rows flow, ``kill -9`` of one engine process (a replica: a
   child of the job leading a process group of its own); the job must finish with every
   picture's row exactly once, and the GPU memory the engine held must be free within 10 s
   (NVML's used memory sampled every 0.2 s);
2. **the job killed**: once rows flow, ``kill -9`` of the job alone; within 10 s no process
   of the job may be left and the GPU's memory must be back to what it was before the job;
3. **the resume** of that job: every picture's row exactly once.

Each check's numbers and verdict go to the report (the GPU benchmark's notes cite it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mmbatch.bench.monitor import gpu_lines
from mmbatch.bench.workloads import make_images

ROWS_BEFORE_KILL = 200
DEADLINE = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--work-dir", default="/tmp/mmbatch-kill-check")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows-before-kill", type=int, default=ROWS_BEFORE_KILL)
    parser.add_argument("flags", nargs="*", help="more flags for mmbatch caption")
    args = parser.parse_args()
    work = Path(args.work_dir)
    pictures = make_images(work / "pictures", args.images, 448, seed=11)
    folder = pictures[0].parent
    base = [sys.executable, "-m", "mmbatch", "caption", str(folder), "--model", args.model]
    base += ["--no-progress", *args.flags]
    report: dict[str, Any] = {"command": base, "images": args.images, "idle_gpu_mib": _used()}
    rows = args.rows_before_kill
    report["engine_killed"] = _engine_killed(base, work / "a.jsonl", args.images, rows)
    report["job_killed"] = _job_killed(base, work / "b.jsonl", report["idle_gpu_mib"], rows)
    resumed = subprocess.run([*base, "--out", str(work / "b.jsonl")], capture_output=True)
    report["resume"] = {"exit": resumed.returncode, **_rows(work / "b.jsonl", args.images)}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def _engine_killed(base: list[str], out: Path, images: int, rows: int) -> dict[str, Any]:
    job = _start(base, out)
    _await_rows(out, job, rows)
    engines = _engines(job.pid)
    before = _used()
    victim = engines[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    freed_after = None
    samples = []
    while time.monotonic() - killed_at < 15:
        used = _used()
        samples.append(used)
        if freed_after is None and _freed(before, used, len(engines)):
            freed_after = time.monotonic() - killed_at
        time.sleep(0.2)
    code = job.wait()
    return {
        "engines": len(engines),
        "gpu_mib_before": before,
        "gpu_mib_min_after": min((s for s in samples if s is not None), default=None),
        "freed_after_s": freed_after,
        "exit": code,
        **_rows(out, images),
    }


def _freed(before: int | None, used: int | None, engines: int) -> bool:
    """Whether about one engine's share of the memory in use before has been let go."""
    return before is not None and used is not None and before - used > before / engines / 2


def _job_killed(base: list[str], out: Path, idle: int | None, rows: int) -> dict[str, Any]:
    job = _start(base, out)
    _await_rows(out, job, rows)
    group = [job.pid, *_descendants(job.pid)]
    os.kill(job.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    job.wait()
    gone_after = free_after = None
    while time.monotonic() - killed_at < 20 and (gone_after is None or free_after is None):
        now = time.monotonic() - killed_at
        if gone_after is None and not [p for p in group if _running(p)]:
            gone_after = now
        used = _used()
        if free_after is None and used is not None and idle is not None and used <= idle + 512:
            free_after = now
        time.sleep(0.1)
    left = [p for p in group if _running(p)]
    for pid in left:  # do not leave them to the next run
        os.kill(pid, signal.SIGKILL)
    return {
        "processes": len(group),
        "left_after_20_s": len(left),
        "all_gone_after_s": gone_after,
        "gpu_free_after_s": free_after,
        "ok": gone_after is not None and gone_after <= DEADLINE,
    }


def _start(base: list[str], out: Path) -> subprocess.Popen[bytes]:
    for stale in out.parent.glob(out.name + "*"):
        stale.unlink()
    log = open(out.with_name(out.name + ".log"), "wb")  # noqa: SIM115 - the child's
    return subprocess.Popen([*base, "--out", str(out)], stdout=log, stderr=subprocess.STDOUT)


def _await_rows(out: Path, job: subprocess.Popen[bytes], rows: int) -> None:
    while job.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= rows:
            return
        time.sleep(0.05)
    raise RuntimeError(f"the job ended (exit {job.returncode}) before {rows} rows")


def _rows(out: Path, images: int) -> dict[str, Any]:
    ids = Counter(json.loads(line)["id"] for line in out.read_text().splitlines() if line)
    failed = sum(1 for line in out.read_text().splitlines() if json.loads(line)["error"])
    twice = sum(1 for n in ids.values() if n > 1)
    return {
        "rows": sum(ids.values()),
        "ids": len(ids),
        "twice": twice,
        "failed": failed,
        "every_row_once": len(ids) == images and twice == 0,
    }


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = (task / "children").read_text().split() if (task / "children").exists() else []
        found += [int(c) for c in children]
    return found


def _descendants(pid: int) -> list[int]:
    todo, found = _children(pid), []
    while todo:
        child = todo.pop()
        found.append(child)
        todo += _children(child)
    return found


def _engines(job: int) -> list[int]:
    """The job's engine processes: its children that lead a process group of their own."""
    return [pid for pid in _children(job) if _pgid(pid) == pid]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _used() -> int | None:
    """MiB of the first GPU's memory in use (None without a GPU)."""
    used = gpu_lines("memory.used", timeout=10)
    return int(used[0]) if used and used[0].isdigit() else None


if __name__ == "__main__":
    main()
