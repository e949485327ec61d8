"""The streaming pipeline against the fake engine: the plan's grouping as the engine sees it,
the first request's latency, a saturated engine, the byte budget, overlapping submissions,
and decoding in worker processes (which end with a killed job).

Each test takes seconds: one that hangs fails within two minutes, not at the suite's
fifteen."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
from crashing_decoder import CrashingJob
from fake_engine import FakeEngine, expected_text
from picture_requests import caption_requests, write_pictures
from processes import children, in_session, left_after
from repo_paths import REPO

from mmbatch.errors import DecodersFailed
from mmbatch.media import decode as decode_module
from mmbatch.media.decode import Decoded, DecodeJob, ImageJob
from mmbatch.media.decoders import UNUSABLE_AFTER, Decoders
from mmbatch.media.options import ImageOptions, MediaOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.output.stats import JobStats
from mmbatch.pipeline import Pipeline, RunConfig, run_requests
from mmbatch.types import ItemError, MediaItem, Request, Result, Sampling

pytestmark = pytest.mark.timeout(120)


class RecordingEngine(FakeEngine):
    """The fake engine, noting how full it is at each step, and whose requests it holds."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.depths: list[int] = []
        self.tags_in_flight: list[set[str]] = []

    def step(self):  # type: ignore[no-untyped-def]
        self.depths.append(self.num_unfinished())
        self.tags_in_flight.append({r.request_id.split(":")[0] for r in self._queue})
        return super().step()


def run(requests: list[Request], engine: FakeEngine, **run: object) -> tuple[list[dict], object]:  # type: ignore[type-arg]
    sink = MemorySink()
    config = RunConfig(progress=False, **run)  # type: ignore[arg-type]
    stats = run_requests(requests, engine, MediaOptions(), sink, Sampling(), config)
    return sink.rows, stats


def test_prompt_major_input_reaches_the_engine_image_major(tmp_path: Path) -> None:
    paths = write_pictures(tmp_path / "p", 20)
    requests = caption_requests(paths, ["caption", "tags", "ocr", "json"])
    engine = RecordingEngine(capacity=1000)
    rows, stats = run(requests, engine)
    added = [engine_id.split(":", 1)[1] for engine_id in engine.added]
    pictures_in_order = [request_id.split(":")[1] for request_id in added]
    # Each picture's four prompts went in one after another (its encoder output and prefix
    # shared), though the input put 20 other rows between each of them.
    runs = [pictures_in_order[i : i + 4] for i in range(0, len(added), 4)]
    assert all(len(set(run)) == 1 for run in runs)
    assert len({run[0] for run in runs}) == 20
    assert stats.decodes == 20  # each picture decoded once for its four prompts
    for row in rows:
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])


class FirstAddSeen(RecordingEngine):
    """The fake engine, saying (``first``) when its first request is in."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.first = threading.Event()

    def add(self, request, media, sampling):  # type: ignore[no-untyped-def]
        super().add(request, media, sampling)
        self.first.set()


def test_the_first_request_reaches_the_engine_before_the_job_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_pictures(tmp_path / "p", 40)
    engine = FirstAddSeen(capacity=1000)
    events: list[str] = []
    started: list[int] = []
    waited_in_vain: list[int] = []
    deadline = time.monotonic() + 30
    real = decode_module._DECODERS[ImageJob]

    def held_after_five(job):  # type: ignore[no-untyped-def]
        # The sixth picture on is decoded only once the first request is in the engine (30 s
        # at most): a job that sends nothing before it has decoded them all waits in vain.
        started.append(len(started))
        if len(started) > 5 and not engine.first.wait(max(0.0, deadline - time.monotonic())):
            waited_in_vain.append(len(started))
        made = real(job)
        events.append("decoded")
        return made

    monkeypatch.setitem(decode_module._DECODERS, ImageJob, held_after_five)
    real_add = engine.add

    def adding(request, media, sampling):  # type: ignore[no-untyped-def]
        if not engine.first.is_set():
            events.append("added")
        real_add(request, media, sampling)

    monkeypatch.setattr(engine, "add", adding)
    run(caption_requests(paths, ["p"]), engine, decode_workers=0)
    # The first picture went to the engine as soon as it was decoded, not after all 40.
    assert not waited_in_vain
    assert events.count("decoded") == 40
    assert events.index("added") <= 5, events


def test_the_engine_is_kept_at_its_capacity_while_work_remains(tmp_path: Path) -> None:
    paths = write_pictures(tmp_path / "p", 80)
    # Steps of 50 ms: time for the feeder's threads to top the engine up between two steps
    # on a loaded machine (at 3 ms they were sometimes not scheduled in time; a picture
    # decodes in about one).
    engine = RecordingEngine(capacity=8, per_step=1, step_seconds=0.05)
    run(caption_requests(paths, ["p"]), engine)
    # Once first full (decoding has started), until fewer than 8 requests were left to
    # finish, every step found the engine full.
    assert max(engine.depths) == 8
    working = engine.depths[engine.depths.index(8) : len(engine.depths) - 8]
    full = sum(1 for depth in working if depth == 8)
    assert len(working) >= 60, engine.depths
    assert full >= 0.9 * len(working), engine.depths


def test_media_held_stay_within_the_byte_budget(tmp_path: Path) -> None:
    paths = write_pictures(tmp_path / "p", 60, size=200)  # 120 kB each, decoded
    item = 200 * 200 * 3
    peaks = {}
    for budget in (10**6, 10**9):
        engine = FakeEngine(capacity=64, per_step=1, step_seconds=0.002)
        pipeline = Pipeline(engine, RunConfig(progress=False, memory_budget=budget))
        try:
            requests = caption_requests(paths, ["p"])
            pipeline.submit(requests, Sampling(), MediaOptions(), sink=MemorySink()).wait()
            peaks[budget] = pipeline.feeder.peak_bytes
            preparing = pipeline.feeder.preparing_cap
        finally:
            pipeline.close()
    # Over the budget by at most the units in preparation when it was reached.
    assert peaks[10**6] <= 10**6 + preparing * item, peaks
    # Without that bound the same job holds every picture the engine has room for.
    assert peaks[10**9] > 4 * 10**6, peaks


class WaitsForTheSecond(RecordingEngine):
    """The fake engine, finishing nothing until a request of a second submission is in (30 s
    at most): whether it comes while the first's still run is the pipeline's doing then, not
    a race between the second's decoding and the first's few steps."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.deadline = time.monotonic() + 30

    def step(self):  # type: ignore[no-untyped-def]
        tags = {engine_id.split(":")[0] for engine_id in self.added}
        if len(tags) < 2 and time.monotonic() < self.deadline:
            time.sleep(0.002)
            return []
        return super().step()


def test_overlapping_submissions_keep_the_engine_busy_between_them(tmp_path: Path) -> None:
    paths = write_pictures(tmp_path / "p", 30)
    engine = WaitsForTheSecond(capacity=16, per_step=2, step_seconds=0.002)
    pipeline = Pipeline(engine, RunConfig(progress=False))
    try:
        first, second = (
            pipeline.submit(
                caption_requests(paths[i : i + 15], [f"p{i}"]), Sampling(), MediaOptions()
            )
            for i in (0, 15)
        )
        results = [first.wait(), second.wait()]
    finally:
        pipeline.close()
    assert [r.ok for r in results] == [15, 15]
    # The second batch's requests were in the engine while the first's still ran, and the
    # engine never stood empty between the two.
    both = [tags for tags in engine.tags_in_flight if len(tags) == 2]
    assert both
    assert all(depth > 0 for depth in engine.depths)


def test_rows_arrive_to_each_submission_by_id_from_many_threads(tmp_path: Path) -> None:
    paths = write_pictures(tmp_path / "p", 12)
    engine = FakeEngine(capacity=6, per_step=3)
    pipeline = Pipeline(engine, RunConfig(progress=False))
    outputs: dict[int, list[dict]] = {}  # type: ignore[type-arg]

    def one(n: int) -> None:
        sink = MemorySink()
        requests = caption_requests(paths, [f"prompt {n}"])
        pipeline.submit(requests, Sampling(), MediaOptions(), sink=sink).wait()
        outputs[n] = sink.rows

    try:
        threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        pipeline.close()
    assert sorted(outputs) == [0, 1, 2, 3]
    for n, rows in outputs.items():
        assert len(rows) == 12
        for row in rows:
            assert row["prompt"] == f"prompt {n}"
            assert row["text"] == expected_text([row["media_hash"]], f"prompt {n}")


def test_decoding_in_worker_processes_gives_the_same_rows(samples: Path, tmp_path: Path) -> None:
    paths = [p for p in sorted(samples.iterdir()) if p.suffix in (".jpg", ".png")]
    requests = caption_requests(paths, ["a", "b"])
    here, _ = run(requests, FakeEngine(), decode_workers=0)
    workers, stats = run(requests, FakeEngine(), decode_workers=2)
    assert sorted(map(str, here)) == sorted(map(str, workers))
    assert stats.failed == 2  # truncated.jpg, under both prompts


def test_a_host_without_pyav_still_decodes_pictures_in_worker_processes(
    samples: Path, tmp_path: Path
) -> None:
    """The pool's initializer warms PyAV; where PyAV cannot be imported that warm-up must not
    break the pool (it did on the GPU host: every picture of a job became an error row)."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "av.py").write_text("raise ImportError('PyAV is not installed here')\n")
    script = (
        "from mmbatch.media.decode import ImageJob, decode\n"
        "from mmbatch.media.decoders import decode_pool\n"
        "from mmbatch.media.options import ImageOptions\n"
        f"data = open({str(samples / 'sunset.jpg')!r}, 'rb').read()\n"
        "job = ImageJob('k', data, ImageOptions())\n"
        "print(type(decode_pool(2).submit(decode, job).result(timeout=60)['k']).__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO)])}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() != "ItemError"


def test_the_decode_workers_of_a_killed_job_end_with_it(samples: Path) -> None:
    """A job killed by SIGKILL shuts nothing down: its decode workers (and multiprocessing's
    resource tracker, once they are gone) must end by themselves, within two seconds."""
    script = (
        "from mmbatch.media.decode import ImageJob, decode\n"
        "from mmbatch.media.decoders import decode_pool, start_decoders\n"
        "from mmbatch.media.options import ImageOptions\n"
        "start_decoders(2)\n"
        f"data = open({str(samples / 'sunset.jpg')!r}, 'rb').read()\n"
        "decode_pool(2).submit(decode, ImageJob('k', data, ImageOptions())).result(timeout=60)\n"
        "print('decoded', flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, start_new_session=True
    )
    with job:
        assert job.stdout is not None
        assert job.stdout.readline() == b"decoded\n"
        workers = children(job.pid)
        assert len(workers) >= 3  # two workers and the resource tracker
        job.kill()
        job.wait()
    assert not left_after(partial(in_session, job.pid), 2.0)


CTRL_C_AS_A_WORKER_STARTS = """
import os, signal, sys, threading, time
from concurrent.futures import ProcessPoolExecutor
from mmbatch.media.decoders import decode_pool

if __name__ == "__main__":
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # catches the signal
    spawn = ProcessPoolExecutor._adjust_process_count

    def spawn_then_ctrl_c(self):
        spawn(self)  # a worker started and counted; the pool not yet watching its workers
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()
        time.sleep(0.5)

    ProcessPoolExecutor._adjust_process_count = spawn_then_ctrl_c
    try:
        decode_pool(2).submit(int, 1)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


def test_ctrl_c_while_the_decode_pool_starts_a_worker_leaves_a_pool_that_stops(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the decode pool starts a worker inside ``submit`` is taken once the
    ``submit`` is over: taken inside it (between the worker's start and the pool starting
    the thread that stops its workers), the job's exit waited for that worker forever."""
    script = tmp_path / "job.py"
    script.write_text(CTRL_C_AS_A_WORKER_STARTS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "interrupted\n"
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_engine_counts_as_starved_only_below_its_fullest_with_nothing_waiting() -> None:
    stats = JobStats()
    # The ramp: a full batch with nothing waiting is busy, not starved; then a sample below
    # the full batch with nothing waiting while requests were still to be handed over.
    for running, waiting, backlog in [(1024, 0, 900), (1024, 0, 400), (700, 0, 50), (700, 0, 0)]:
        stats.sample_queue(running, waiting, backlog)
    queue = stats.queue_summary()
    assert queue is not None
    assert queue["feeding_samples"] == 3
    assert queue["starved_samples"] == 1
    assert queue["starved_share"] == round(1 / 3, 3)


def test_the_summary_counts_the_starved_samples_rather_than_a_share_of_few() -> None:
    stats = JobStats()
    # The whole job handed over in the first sample, the engine still filling: one of one.
    for running, waiting, backlog in [(700, 0, 1300), (1024, 80, 0), (976, 0, 0)]:
        stats.sample_queue(running, waiting, backlog)
    line = next(x for x in stats.summary().splitlines() if x.startswith("engine queue"))
    assert "running median 976 (max 1024)" in line
    assert line.endswith(
        "below its fullest in 1 of the 1 samples taken while requests were still to be handed to it"
    )


def test_the_queue_timeline_keeps_each_sample_with_its_time() -> None:
    stats = JobStats()
    stats.sample_queue(10, 5, 100, 15)
    time.sleep(0.05)
    stats.sample_queue(12, 0, 0, 30)  # 18 handed over but not yet in the engine's queues
    first, second = stats.queue_timeline()
    assert first[1:] == [10, 5, 100, 15]
    assert second[1:] == [12, 0, 0, 30]
    assert 0 <= first[0] < second[0]
    assert stats.to_dict()["engine_timeline"] == [first, second]  # the job's summary file


def test_a_long_runs_timeline_keeps_every_kth_sample() -> None:
    stats = JobStats()
    for n in range(2000):
        stats.sample_queue(n, 0, 2000 - n)
    timeline = stats.queue_timeline(most=720)
    assert 500 < len(timeline) <= 720
    assert [s[1] for s in timeline[:3]] == [0, 3, 6]  # every third sample, from the first


def decode_all(decoders: Decoders, jobs: list[CrashingJob]) -> dict[str, object]:
    """Each job's outcome by key, once all came back; the decoders closed after."""
    outcomes: dict[str, object] = {}
    finished = threading.Event()

    def done(job: DecodeJob, made: Decoded) -> None:
        outcomes.update(made)
        if len(outcomes) == len(jobs):
            finished.set()

    try:
        for job in jobs:
            decoders.submit(job, done)
        assert finished.wait(180), f"only {sorted(outcomes)} came back"
    finally:
        decoders.close()
    return outcomes


def test_a_decoder_that_kills_its_worker_fails_its_own_item_alone() -> None:
    """A worker's death breaks the whole pool: the decodes then in flight are tried again
    alone, and only the item that kills its worker there too becomes an error."""
    jobs = [CrashingJob(f"k{n}", f"picture {n}".encode(), ImageOptions()) for n in range(8)]
    jobs.insert(3, CrashingJob("culprit", b"crash", ImageOptions()))
    decoders = Decoders(3)
    outcomes = decode_all(decoders, jobs)
    assert decoders.fatal is None
    failed = {key for key, item in outcomes.items() if isinstance(item, ItemError)}
    assert failed == {"culprit"}
    culprit = outcomes["culprit"]
    assert isinstance(culprit, ItemError)
    assert "died on this item" in culprit.message
    for n in range(8):
        item = outcomes[f"k{n}"]
        assert isinstance(item, MediaItem)
        assert item.payload == f"picture {n}".encode()


def test_workers_that_die_on_every_item_stop_the_job() -> None:
    """Told apart from hostile items by dying alone again and again with nothing decoded in
    between (a pool that cannot start: every picture of a job became an error row)."""
    jobs = [CrashingJob(f"k{n}", b"crash", ImageOptions()) for n in range(UNUSABLE_AFTER + 1)]
    decoders = Decoders(2)
    decode_all(decoders, jobs)
    assert decoders.fatal is not None
    assert "cannot run here" in str(decoders.fatal)


class HoldingEngine(FakeEngine):
    """The fake engine, finishing nothing: what it is given stays until aborted."""

    def step(self) -> list[Result]:
        time.sleep(0.01)
        return []


def test_a_job_stopped_by_its_decoders_leaves_nothing_in_the_engine(tmp_path: Path) -> None:
    """The engine is well when the decoders fail: a shared one serves the next caller, so
    what the job had in it is aborted, not left to come back to nobody."""
    first, second = write_pictures(tmp_path / "p", 2)
    engine = HoldingEngine()
    pipeline = Pipeline(engine, RunConfig(progress=False, decode_workers=0))
    try:
        held = pipeline.submit(caption_requests([first], ["p"]), Sampling(), MediaOptions())
        deadline = time.monotonic() + 30
        while not engine.added and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.num_unfinished() == 1
        pipeline.feeder._decoders.fatal = DecodersFailed("the decode workers cannot run here")
        stopped = pipeline.submit(caption_requests([second], ["p"]), Sampling(), MediaOptions())
        for submission in (held, stopped):
            with pytest.raises(DecodersFailed):
                submission.wait()
    finally:
        pipeline.close()
    assert engine.num_unfinished() == 0
