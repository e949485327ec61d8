"""Kills on a real host: an engine process killed mid-job, then the job itself.

``python benchmarks/kill_check.py --model M --images 2000 --out REPORT.json -- [caption
flags]`` runs ``mmbatch caption`` on W1-like pictures three times:

1. **an engine killed**: once rows flow, ``kill -9`` of one engine process (a replica: a
   child of the job leading a process group of its own); the job must finish with every
   picture's row exactly once, and the GPU memory the engine held must be free within 10 s
   (NVML's used memory sampled every 0.2 s); the report gives the summary's restart
   (``restarts``, ``restart_seconds``) apart from the work's seconds and speed;
2. **the job killed**: once rows flow, ``kill -9`` of the job alone; within 10 s no process
   of the job may be left and the GPU's memory must be back to what it was before the job;
3. **the resume** of that job: every picture's row exactly once.

With ``--ray`` it runs the Ray face instead (``mmbatch caption FOLDER --ray local
--replicas 1``: a one-node Ray of the job's own, the output a folder of Ray's files):

1. **a replica killed**: once rows are in the folder, ``kill -9`` of the engine actor's
   process (the replica says its pid in the engine's log, ``OUT.vllm.log``); the report
   says whether the job went on (exit 0) or stopped saying why (its exit code and last
   lines), how long after the kill it ended, its rows (none twice), and within 10 s of its
   end: no process of its session left (Ray's own included) and the GPU's memory back to
   what it was before;
2. **the resume** (the same command again): every picture's row exactly once, and the
   same checks of its end.

Without a GPU (no ``nvidia-smi``) the memory checks are skipped, and the report says so.
Each check's numbers and verdict go to the report (the GPU benchmark's notes cite it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mmbatch.bench.monitor import gpu_lines
from mmbatch.bench.workloads import make_images
from mmbatch.integrations.ray_replica import REPLICA_PROCESS

ROWS_BEFORE_KILL = 200
DEADLINE = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--work-dir", default="/tmp/mmbatch-kill-check")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows-before-kill", type=int, default=ROWS_BEFORE_KILL)
    parser.add_argument("--ray", action="store_true", help="the Ray face (--ray local)")
    parser.add_argument(
        "--give-up-after",
        type=float,
        default=1800.0,
        help="with --ray: seconds before a job counts as hung",
    )
    parser.add_argument("flags", nargs="*", help="more flags for mmbatch caption")
    args = parser.parse_args()
    work = Path(args.work_dir)
    pictures = make_images(work / "pictures", args.images, 448, seed=11)
    folder = pictures[0].parent
    base = [sys.executable, "-m", "mmbatch", "caption", str(folder), "--model", args.model]
    base += ["--no-progress", *args.flags]
    report: dict[str, Any] = {"command": base, "images": args.images, "idle_gpu_mib": _used()}
    if report["idle_gpu_mib"] is None:
        report["gpu"] = "no GPU seen (nvidia-smi): the GPU memory checks are skipped"
    if args.ray:
        ray_checks(base, work, args, report)
    else:
        report.update(local_checks(base, work, args, report["idle_gpu_mib"]))
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def local_checks(
    base: list[str], work: Path, args: argparse.Namespace, idle: int | None
) -> dict[str, Any]:
    """The local runner's checks: an engine replica killed, the job killed, its resume."""
    report: dict[str, Any] = {}
    rows = args.rows_before_kill
    report["engine_killed"] = _engine_killed(base, work / "a.jsonl", args.images, rows)
    report["job_killed"] = _job_killed(base, work / "b.jsonl", idle, rows)
    resumed = subprocess.run([*base, "--out", str(work / "b.jsonl")], capture_output=True)
    report["resume"] = {"exit": resumed.returncode, **_rows(work / "b.jsonl", args.images)}
    return report


def ray_checks(
    base: list[str], work: Path, args: argparse.Namespace, report: dict[str, Any]
) -> None:
    """The Ray face's checks, into ``report``: a replica's process killed once rows are in
    the folder, then the resume; each job's end checked for processes left and the GPU's
    memory. The report is written after each, so that a run cut short keeps the first."""
    command = [*base, "--ray", "local", "--replicas", "1"]
    out = work / "ray-rows"
    for stale in [out, *work.glob(out.name + ".*")]:
        subprocess.run(["rm", "-rf", str(stale)], check=True)
    report["ray_command"] = [*command, "--out", str(out)]
    idle = _used()
    report["replica_killed"] = _ray_job(command, out, idle, args, args.rows_before_kill)
    Path(args.out).write_text(json.dumps(report, indent=2))
    report["resume"] = _ray_job(command, out, idle, args, kill_after_rows=None)


def _ray_job(
    command: list[str],
    out: Path,
    idle: int | None,
    args: argparse.Namespace,
    kill_after_rows: int | None,
) -> dict[str, Any]:
    """Run ``command`` into the folder ``out`` in a session of its own; with
    ``kill_after_rows``, ``kill -9`` the replica's process once that many rows are saved."""
    log = out.with_name(out.name + f".stderr-{'killed' if kill_after_rows else 'resume'}.txt")
    engine_log = out.with_name(out.name + ".vllm.log")
    named_before = len(_replica_pids(engine_log))
    with open(log, "wb") as stderr:
        job = subprocess.Popen(
            [*command, "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # Ray's processes, its actors and engines stay in it
        )
    started = time.monotonic()
    report: dict[str, Any] = {}
    if kill_after_rows is not None:
        report.update(_kill_replica(job, out, kill_after_rows, args.give_up_after))
    began = report.pop("killed_at", started)
    code, least = _wait(job, started + args.give_up_after, watch_gpu=idle is not None)
    ended = time.monotonic()
    if least is not None and kill_after_rows is not None:
        report["gpu_mib_least_after_kill"] = least
    report["exit"] = "hung" if code is None else code
    said = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    report["verdict"] = _verdict(code, said)
    report["ended_after_s" if kill_after_rows else "took_s"] = round(ended - began, 1)
    report["stderr_tail"] = said[-8:]
    report["replicas_started"] = len(_replica_pids(engine_log)) - named_before
    report.update(_after_the_end(job.pid, ended, idle))
    if code is None:
        job.wait()  # killed with what it left
    saved = _folder_rows(out)
    report["rows"] = {
        "rows": sum(saved.values()),
        "ids": len(saved),
        "twice": sum(1 for n in saved.values() if n > 1),
        "every_row_once": len(saved) == args.images and all(n == 1 for n in saved.values()),
    }
    return report


def _wait(
    job: subprocess.Popen[bytes], deadline: float, watch_gpu: bool
) -> tuple[int | None, int | None]:
    """The job's exit code (None: still running at ``deadline``, hung) and, with
    ``watch_gpu``, the least GPU memory in use meanwhile (MiB, sampled every 0.5 s)."""
    least = None
    while job.poll() is None and time.monotonic() < deadline:
        used = _used() if watch_gpu else None
        if used is not None:
            least = used if least is None else min(least, used)
        time.sleep(0.5)
    return job.poll(), least


def _verdict(code: int | None, said: list[str]) -> str:
    """How the job ended: went on (exit 0), stopped loudly (another exit, and a line of
    mmbatch's saying why), stopped silently, or hung."""
    if code is None:
        return "hung"
    if code == 0:
        return "went on"
    reasons = [line for line in said if line.startswith("mmbatch:")]
    return f"stopped loudly: {reasons[-1]}" if reasons else "stopped silently"


def _kill_replica(
    job: subprocess.Popen[bytes], out: Path, rows: int, give_up_after: float
) -> dict[str, Any]:
    """Once ``rows`` rows are in ``out``, ``kill -9`` the replica's process: the last one the
    engine's log names, which must be in the job's session."""
    deadline = time.monotonic() + give_up_after
    while sum(_folder_rows(out).values()) < rows:
        if job.poll() is not None or time.monotonic() > deadline:
            return {"killed": f"no: the job ended or hung (exit {job.poll()}) before {rows} rows"}
        time.sleep(0.05)
    saved = sum(_folder_rows(out).values())
    replicas = _replica_pids(out.with_name(out.name + ".vllm.log"), job.pid)
    if not replicas:
        return {"killed": "no: no replica of the job's session named in the engine's log"}
    victim = replicas[-1]
    title = _title(victim)
    before = _used()
    os.kill(victim, signal.SIGKILL)
    return {
        "killed": f"pid {victim} ({title})",
        "rows_saved_at_kill": saved,
        "gpu_mib_at_kill": before,
        "killed_at": time.monotonic(),
    }


def _after_the_end(session: int, ended: float, idle: int | None) -> dict[str, Any]:
    """Whether, within ``DEADLINE`` s of the job's end, no process of its session is left
    and the GPU's memory is back to ``idle``; what is still left then is killed."""
    gone_after = free_after = None
    while time.monotonic() - ended < DEADLINE and (
        gone_after is None or (free_after is None and idle is not None)
    ):
        now = round(time.monotonic() - ended, 1)
        if gone_after is None and not _in_session(session):
            gone_after = now
        used = _used() if idle is not None else None
        if free_after is None and used is not None and idle is not None and used <= idle + 512:
            free_after = now
        time.sleep(0.1)
    left = {pid: _title(pid) for pid in _in_session(session)}
    for pid in left:  # do not leave them to the next run
        os.kill(pid, signal.SIGKILL)
    report: dict[str, Any] = {
        "processes_gone_after_s": gone_after,
        "left_after_10_s": [f"{pid} {title}" for pid, title in left.items()],
    }
    if idle is not None:
        report["gpu_mib_after_10_s"] = _used()
        report["gpu_free_after_s"] = free_after
    return report


def _folder_rows(out: Path) -> Counter[str]:
    """How many whole rows each id has in the folder ``out`` (a file being written may end
    mid-row; a file set aside, ``.partial-*``, is not the folder's)."""
    ids: Counter[str] = Counter()
    for file in sorted(out.glob("[!.]*.json")) if out.exists() else []:
        data = file.read_bytes()
        ids.update(json.loads(line)["id"] for line in data[: data.rfind(b"\n") + 1].splitlines())
    return ids


def _replica_pids(engine_log: Path, session: int | None = None) -> list[int]:
    """The replicas' processes the engine's log names (``REPLICA_PROCESS``), oldest first;
    with ``session``, those alive in it only."""
    words = re.escape(REPLICA_PROCESS).replace(r"\{pid\}", r"(\d+)").replace(r"\{node\}", "")
    text = engine_log.read_text(errors="replace") if engine_log.exists() else ""
    named = [int(m[1]) for m in re.finditer(words, text)]
    if session is None:
        return named
    alive = set(_in_session(session))
    return [pid for pid in named if pid in alive]


def _in_session(session: int) -> list[int]:
    """The live processes of ``session`` (a job started in a session of its own: its pid),
    whatever process group they moved to."""
    found = []
    for pid in (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
        fields = _stat_fields(pid)  # state, parent, group, session, ...
        if fields[3:4] == [str(session)] and fields[0] != "Z":
            found.append(pid)
    return found


def _stat_fields(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80].strip()
    except OSError:
        return "(gone)"


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
        **_restart_and_work(out),
    }


def _restart_and_work(out: Path) -> dict[str, Any]:
    """The summary's figures of the job whose engine was killed: the restart (how many,
    and their start-up's seconds) apart from the work (its seconds and speed)."""
    summary = out.with_name(out.name + ".summary.json")
    if not summary.exists():
        return {}
    stats = json.loads(summary.read_text())["stats"]
    names = ("restarts", "restart_seconds", "wall_seconds", "items_per_second")
    return {name: stats.get(name) for name in names}


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
