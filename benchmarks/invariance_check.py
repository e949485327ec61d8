"""Do interrupted and differently laid-out runs write the texts of one uninterrupted run?

``python benchmarks/invariance_check.py --model M --images 600 --out REPORT.json --
[caption flags]`` captions W1-like pictures greedily with ``mmbatch caption`` three times,
with the same flags (add ``--batch-invariant`` to check vLLM's batch-invariant mode;
``--runs reference,ray`` runs only those):

1. **reference**: uninterrupted, one engine per GPU;
2. **killed and resumed**: ``kill -9`` of the job once rows flow, then the same command
   again, which resumes: the rows written after the kill were batched with other requests
   than in the reference;
3. **another layout**: two engines per GPU, each request batched with others again (what
   spreading a job over Ray replicas does to its batches);
4. with ``--ray``, **on Ray**: the same command with ``--ray local --replicas 1`` (a
   one-node Ray of the job's own), its output a folder of Ray's files.

The pictures' folder also holds a truncated JPEG, whose row is an error on every run. The
report counts, for each run against the reference, the rows whose text differs, and the
rows whose error or media hash differs. vLLM's kernels reduce in an order that depends on
the batch, so without the mode some texts may differ on near-tie logits; with it, none
should; errors and media hashes never should. The report is written again after each run,
so a check cut short (a GPU call's time limit) keeps the runs it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from mmbatch.bench.whole import clear_earlier_run
from mmbatch.bench.workloads import make_images
from mmbatch.output.folders import read_folder
from mmbatch.output.rows import FLAT

ROWS_BEFORE_KILL = 150
RUNS = ("killed", "two-engines", "ray")
"""The runs checked against the reference, in the order they run."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--work-dir", default="/tmp/mmbatch-invariance-check")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows-before-kill", type=int, default=ROWS_BEFORE_KILL)
    parser.add_argument("--ray", action="store_true", help="a fourth run, on Ray (--ray local)")
    parser.add_argument(
        "--runs",
        default="killed,two-engines",
        help=f"the runs against the reference, comma-separated, of: {', '.join(RUNS)}",
    )
    parser.add_argument("flags", nargs="*", help="more flags for mmbatch caption")
    args = parser.parse_args()
    runs = {name.strip() for name in args.runs.split(",") if name.strip()} - {"reference"}
    runs |= {"ray"} if args.ray else set()
    if runs - set(RUNS):
        parser.error(f"--runs: no run named {', '.join(sorted(runs - set(RUNS)))}")
    work = Path(args.work_dir)
    folder = make_images(work / "pictures", args.images, 448, seed=13)[0].parent
    truncated = folder / "truncated.jpg"
    truncated.write_bytes(next(folder.glob("*.jpg")).read_bytes()[:400])
    base = [sys.executable, "-m", "mmbatch", "caption", str(folder), "--model", args.model]
    base += ["--no-progress", "--temperature", "0", *args.flags]
    report: dict[str, Any] = {"command": base, "images": args.images}
    out = Path(args.out)
    reference = _run([*base, "--engines-per-gpu", "1"], work / "reference.jsonl")
    report["reference"] = {"seconds": reference[1], "rows": len(reference[0])}
    out.write_text(json.dumps(report, indent=2))
    if "killed" in runs:
        killed = [*base, "--engines-per-gpu", "1", "--out", str(work / "killed.jsonl")]
        report["killed_and_resumed"] = _killed_and_resumed(killed, args.rows_before_kill)
        resumed = _rows(work / "killed.jsonl")
        report["killed_and_resumed"]["differ"] = _differ(reference[0], resumed)
        out.write_text(json.dumps(report, indent=2))
    others = {
        "two-engines": ("two_engines", ["--engines-per-gpu", "2"], "two-engines.jsonl"),
        "ray": ("ray", ["--ray", "local", "--replicas", "1"], "ray-rows"),
    }
    for name, (key, flags, output) in others.items():
        if name in runs:
            rows, seconds = _run([*base, *flags], work / output)
            report[key] = {"seconds": seconds, "differ": _differ(reference[0], rows)}
            out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def _run(argv: list[str], out: Path) -> tuple[dict[str, Row], float]:
    """The rows by id of ``argv`` run to its end into ``out``, and its seconds."""
    clear_earlier_run(out)
    began = time.monotonic()
    subprocess.run([*argv, "--out", str(out)], check=False, capture_output=True)
    return _rows(out), round(time.monotonic() - began, 1)


def _killed_and_resumed(argv: list[str], rows: int) -> dict[str, Any]:
    out = Path(argv[-1])
    clear_earlier_run(out)
    job = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    while job.poll() is None and _count(out) < rows:
        time.sleep(0.1)
    written = _count(out)
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    time.sleep(2)  # what the kill left goes
    resumed = subprocess.run(argv, check=False, capture_output=True)
    return {"rows_before_kill": written, "resume_exit": resumed.returncode}


def _count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


class Row(NamedTuple):
    """What a row must keep across runs."""

    text: str | None
    error: Any
    media_hash: str | None


def _rows(path: Path) -> dict[str, Row]:
    """The rows by id in the JSON-lines file ``path``, or in the folder of Ray's files."""
    if path.is_dir():
        rows = list(read_folder(path, "jsonl", FLAT, set_aside=False))
    else:
        lines = path.read_text().splitlines() if path.exists() else []
        rows = [json.loads(line) for line in lines]
    return {row["id"]: Row(row["text"], row["error"], row.get("media_hash")) for row in rows}


def _differ(reference: dict[str, Row], rows: dict[str, Row]) -> dict[str, Any]:
    both = [i for i in reference if i in rows]
    differing = sorted(i for i in both if rows[i].text != reference[i].text)
    return {
        "same_ids": reference.keys() == rows.keys(),
        "rows": len(rows),
        "error_rows": sum(1 for row in rows.values() if row.error is not None),
        "texts_differ": len(differing),
        "errors_differ": sum(1 for i in both if rows[i].error != reference[i].error),
        "media_hashes_differ": sum(
            1 for i in both if rows[i].media_hash != reference[i].media_hash
        ),
        "examples": differing[:5],
    }


if __name__ == "__main__":
    main()
