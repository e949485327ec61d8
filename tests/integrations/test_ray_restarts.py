"""A Ray replica whose process dies: started again while that helps, and the job stopped,
loudly and with its rows saved, once it no longer does; a restart's start-up counted as
such in the summary, not as work.

The real test runs ``mmbatch caption --ray local`` with the tiny model on vLLM's CPU build
and plays the kernel's OOM killer: it ``kill -9``s the replica's process once rows are
saved, and then each process Ray starts in its place as soon as that one names itself in
the engine's log (``REPLICA_PROCESS``, said just before its engine loads the model).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from conftest import TINY_ENGINE_FLAGS
from PIL import Image
from processes import in_session, left_after
from test_ray_data import RAY_CLI, complete_rows

from mmbatch.cli import EXIT_ITEMS_FAILED, EXIT_JOB_FAILED, EXIT_OK
from mmbatch.integrations.ray_replica import REPLICA_PROCESS
from mmbatch.integrations.replica_starts import MAX_DEATHS_IN_A_ROW, ReplicaStarts
from mmbatch.words import counted

PICTURES = 12
STOPS_WITHIN_S = 240.0
"""Seconds the job has, from the first kill, to stop (the restarts' imports take a few
each; a job that restarts its replica forever never stops)."""


def named_replicas(log: Path) -> list[int]:
    """The replicas' processes the engine's log names, oldest first."""
    words = re.escape(REPLICA_PROCESS).replace(r"\{pid\}", r"(\d+)").replace(r"\{node\}", "")
    text = log.read_text(errors="replace") if log.exists() else ""
    return [int(found[1]) for found in re.finditer(words, text)]


def run_killing_replicas(
    argv: list[str], out: Path, every_start: bool, tmp_path: Path
) -> tuple[int, str, list[int], int]:
    """Run the job ``argv`` (a session of its own) and ``kill -9`` its replica once a row
    more than the folder held is saved; with ``every_start``, also each process started in
    its place, as soon as the engine's log names it. Its exit code, its stderr, the
    processes killed and the rows saved at the first kill."""
    log = out.with_name(out.name + ".vllm.log")
    before = len(complete_rows(out))
    named_before = len(named_replicas(log))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    stderr_file = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
    killed: list[int] = []
    saved_at_kill = -1
    with open(stderr_file, "wb") as stderr:
        job = subprocess.Popen(
            [sys.executable, "-c", RAY_CLI, *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # Ray's processes, its actors among them, stay in it
        )
    first_kill: float | None = None
    deadline = time.monotonic() + 600
    try:
        while job.poll() is None:
            now = time.monotonic()
            assert now < deadline, "no row saved within 600 s"
            assert first_kill is None or now < first_kill + STOPS_WITHIN_S, (
                f"the job neither went on nor stopped within {STOPS_WITHIN_S:.0f} s of the first "
                f"kill: its replica was started {len(named_replicas(log)) - named_before} times"
            )
            if first_kill is None and len(complete_rows(out)) > before:
                saved_at_kill = len(complete_rows(out))
                first_kill = now
            if first_kill is not None:
                ours = set(in_session(job.pid))
                for pid in named_replicas(log)[named_before:]:
                    if pid in ours and pid not in killed and (every_start or not killed):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            time.sleep(0.02)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # a job that hangs is not left behind
        code = job.wait()
    left = left_after(partial(in_session, job.pid), 10.0)
    for line in left:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, f"processes left after the job: {left}"
    return code, stderr_file.read_text(errors="replace"), killed, saved_at_kill


@pytest.mark.ray
@pytest.mark.slow
def test_a_replica_that_dies_at_every_start_stops_the_job_loudly_and_a_rerun_resumes(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for i in range(PICTURES):
        Image.new("RGB", (32, 32), (i * 20, 255 - i * 20, i * 7)).save(pictures / f"{i:02d}.png")
    out = tmp_path / "rows"
    argv = ["caption", str(pictures), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += ["--max-tokens", "8", *TINY_ENGINE_FLAGS, "--gpus-per-replica", "0"]
    argv += ["--ray-batch", "1", "--ray", "local"]

    # Killed mid-job, then at each start: the job stops once the replica has died twice in
    # a row without finishing a batch, rather than start it again forever.
    code, stderr, killed, saved_at_kill = run_killing_replicas(argv, out, True, tmp_path)
    assert code == EXIT_JOB_FAILED, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(killed) == MAX_DEATHS_IN_A_ROW  # its process, and one restart's
    assert len(named_replicas(out.with_name("rows.vllm.log"))) == MAX_DEATHS_IN_A_ROW
    said = stderr[stderr.index("mmbatch: error: ") :].splitlines()
    assert said[0].startswith(
        "mmbatch: error: a Ray replica's process died 2 times in a row without finishing a "
        "batch, 1 of them while its engine was starting; it is not started again (the last "
        f"was process {os.uname().nodename}:{killed[-1]})"
    ), said
    saved = complete_rows(out)
    assert len(set(saved)) == len(saved)
    assert saved_at_kill <= len(saved) < PICTURES  # the rows saved before stay
    n = len(saved)
    assert said[1] == (
        f"The {counted(n, 'row')} finished {'is' if n == 1 else 'are'} saved in {out} "
        f"({counted(PICTURES - n, 'item')} left); run the same command again to resume."
    )

    # The rerun resumes; its replica killed once mid-job is started again, and the job goes
    # on: that start-up is a restart in the summary, not work.
    code, stderr, killed, _ = run_killing_replicas(argv, out, False, tmp_path)
    assert code == EXIT_OK, stderr[-3000:]
    assert len(killed) == 1
    rows_before = f"{counted(n, 'item')} already {'has' if n == 1 else 'have'} a row"
    assert f"mmbatch: resuming {out}: {rows_before}" in stderr
    assert sorted(complete_rows(out)) == sorted(str(p) for p in pictures.iterdir())
    stats = json.loads((tmp_path / "rows.summary.json").read_text())["stats"]
    assert stats["restarts"] == 1
    # The restart loads the model again: seconds, as the job's own start-up does.
    assert stats["restart_seconds"] > 1.0
    parts = stats["startup_seconds"] + stats["wall_seconds"] + stats["restart_seconds"]
    assert parts <= stats["process_seconds"] + 0.1, stats
    assert stats["items_per_second"] == pytest.approx(
        (PICTURES - len(saved)) / stats["wall_seconds"], abs=0.002
    )
    assert "restarts: 1 engine started again after its process died" in stderr


def test_a_replica_is_started_again_until_it_dies_twice_in_a_row() -> None:
    """The counting, without Ray: deaths in a row since the last finished batch, where they
    struck, and the restarts' seconds (to the engine ready, or to the next start)."""
    starts = ReplicaStarts()
    assert starts.begin("a", 0.0, "n:1") is None
    starts.ready("a", 10.0)
    starts.finished_batch("a")
    assert starts.begin("a", 20.0, "n:2") is None  # one death: started again
    starts.ready("a", 28.0)
    starts.finished_batch("a")  # a batch finished: that death is no longer in a row
    assert starts.begin("a", 40.0, "n:3") is None
    assert starts.begin("b", 41.0, "n:9") is None  # another replica counts apart
    why = starts.begin("a", 45.0, "n:4")  # died while starting: twice in a row
    assert why == (
        "a Ray replica's process died 2 times in a row without finishing a batch, 1 of them "
        "while its engine was starting; it is not started again (the last was process n:3)"
    )
    # Restarts: n:2 (8 s to ready), n:3 (died starting: 5 s to the next start), n:4.
    assert starts.restarts() == (3, 13.0)

    dies_starting = ReplicaStarts()
    assert dies_starting.begin("c", 0.0, "n:5") is None
    assert dies_starting.begin("c", 3.0, "n:6") is None
    why = dies_starting.begin("c", 6.0, "n:7")
    assert why is not None
    assert "each time while its engine was starting" in why
    poison = ReplicaStarts()
    for at in (0.0, 10.0):
        assert poison.begin("d", at, "n:8") is None
        poison.ready("d", at + 5.0)
    why = poison.begin("d", 20.0, "n:8")
    assert why is not None
    assert "each time while it ran a batch" in why


KILLER = Path(__file__).parent.parent / "engine_killer"
"""A folder whose ``sitecustomize`` has the request of prompt ``ENGINE_KILLER_PROMPT`` end
the process that adds it to vLLM's engine, wherever that is run."""


@pytest.mark.ray
@pytest.mark.slow
def test_a_request_that_kills_its_engine_on_ray_is_one_error_row_and_the_job_goes_on(
    tiny_vl_model: Path, tmp_path: Path
) -> None:
    """On Ray as on the local runner: a request that kills the engine each time it is run
    kills the replica's engine process, not the replica; the engine is started again inside
    the replica, the request is found among those in flight and becomes the one error row,
    and the job finishes with every other row answered (not stopped once its replica has
    died twice in a row, as it was when the engine ran in the actor's own process)."""
    pictures = []
    for i in range(3):
        picture = tmp_path / f"{i}.png"
        Image.new("RGB", (32, 32), (i * 60, 200 - i * 60, 40)).save(picture)
        pictures.append(picture)
    manifest = tmp_path / "inputs.jsonl"
    rows = [{"id": f"fine-{i}", "path": str(p), "prompt": "Say."} for i, p in enumerate(pictures)]
    rows.insert(1, {"id": "killer", "path": str(pictures[0]), "prompt": "Crash."})
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "rows"
    argv = ["caption", str(manifest), "--model", str(tiny_vl_model), "--out", str(out)]
    argv += ["--max-tokens", "4", *TINY_ENGINE_FLAGS, "--gpus-per-replica", "0"]
    argv += ["--ray", "local"]  # a Ray of the job's own, started and stopped by it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ENGINE_KILLER_PROMPT"] = "Crash."
    env["PYTHONPATH"] = os.pathsep.join([str(KILLER), *sys.path])
    job = subprocess.Popen(
        [sys.executable, "-m", "mmbatch", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ray's processes, its actors among them, stay in it
    )
    try:
        _, stderr = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # a job that hangs is not left behind
            job.wait()
    left = left_after(partial(in_session, job.pid), 10.0)
    for line in left:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, f"processes left after the job: {left}"
    assert job.returncode == EXIT_ITEMS_FAILED, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    saved = {}
    for file in out.glob("[!.]*.json"):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            saved[row["id"]] = row
    assert sorted(saved) == sorted(row["id"] for row in rows)
    answered = [saved[f"fine-{i}"] for i in range(3)]
    assert [(row["error"], bool(row["text"])) for row in answered] == [(None, True)] * 3, saved
    error = saved["killer"]["error"]
    assert error["kind"] == "engine", error
    assert error["message"].startswith("the engine died each time this request was in it"), error
    assert error["message"].endswith("left out so that the rest of the job goes on"), error
    # The engine's restarts inside the replica reach the job's summary, as a local job's do.
    stats = json.loads((tmp_path / "rows.summary.json").read_text())["stats"]
    assert stats["restarts"] >= MAX_DEATHS_IN_A_ROW, stats
    assert stats["failed"] == 1, stats


def test_the_engines_restarted_inside_the_replicas_are_counted_once_each() -> None:
    """Each replica process tells its engines' restarts so far after every batch: the latest
    replaces the last (cumulative, not added again), and each replica's seconds are over
    its own engines (one of two restarting holds half of it)."""
    from mmbatch.integrations.replica_tally import ReplicaTally
    from mmbatch.types import Restarts

    tally = ReplicaTally()
    assert tally.engine_restarts() == Restarts()
    tally.engines_restarted("n:1", Restarts(1, 10.0, engines=1))
    tally.engines_restarted("n:1", Restarts(2, 30.0, engines=1))
    tally.engines_restarted("n:2", Restarts(1, 8.0, engines=2))
    assert tally.engine_restarts() == Restarts(3, 34.0)


def test_a_replicas_start_up_moments_are_its_first_starts_without_a_batchs_last_row() -> None:
    """A replica tells its moments at its engine's start and after each batch: the first
    told of each name is kept (a restart's do not replace them), and ``last_row``, the end
    of its first batch rather than of the job, is not a start-up moment."""
    from mmbatch.integrations.replica_tally import ReplicaTally

    tally = ReplicaTally()
    tally.started("a", {"started": 1.0, "engine_ready": 5.0})
    tally.started("a", {"started": 1.0, "engine_ready": 5.0, "first_row": 7.0, "last_row": 8.0})
    tally.started("a", {"started": 20.0, "engine_ready": 25.0})  # started again
    assert tally.startups() == [{"started": 1.0, "engine_ready": 5.0, "first_row": 7.0}]


def test_the_replicas_engines_cache_counters_are_summed_once_each() -> None:
    """Each replica process tells its engines' cache counters so far after every batch: the
    latest replaces the last (cumulative), and the job's hit rates are over every replica's."""
    from mmbatch.integrations.replica_tally import ReplicaTally
    from mmbatch.types import CacheStats

    tally = ReplicaTally()
    assert tally.caches() == CacheStats()
    tally.engine_caches("n:1", CacheStats(prefix_queries=100, prefix_hits=10, mm_queries=4))
    tally.engine_caches("n:1", CacheStats(200, 50, 8, 4))
    tally.engine_caches("n:2", CacheStats(100, 50, 8, 0))
    assert tally.caches() == CacheStats(300, 100, 16, 4)
    assert tally.caches().mm_hit_rate == 0.25
