"""Every GPU of the host: the layout chosen for a model, and a job on several engine
processes (fake engines, and two tiny vLLM CPU engines): routing by media and by work left,
one output, a replica killed mid-job, a request that kills every replica it reaches."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import TINY_ENGINE_KWARGS
from fake_engine import FakeEngine, Faults, Lifecycle, expected_text
from picture_requests import caption_requests, write_pictures
from processes import alive, children, group_leaders, in_session, left_after

from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import GIB, Gpu, choose_layout, model_bytes, parameters
from mmbatch.engine.replicas import ReplicaEngine, _serve_engine
from mmbatch.errors import ConfigError, FatalEngineError
from mmbatch.media.options import MediaOptions
from mmbatch.output.sinks import MemorySink
from mmbatch.pipeline import RunConfig, run_requests
from mmbatch.tiny_models import write_real_shape
from mmbatch.types import CacheStats, LoadedRequest, MediaRef, Request, Sampling

H200 = 141 * GIB


def gpus(count: int, memory: int = H200) -> list[Gpu]:
    return [Gpu(str(i), memory) for i in range(count)]


@pytest.fixture(scope="module")
def seven_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-VL-7B's config at its real shape, no weights (what the GPU benchmark runs)."""
    return write_real_shape(tmp_path_factory.mktemp("q7"), "qwen2_5_vl_7b")


def test_a_7b_model_gets_one_engine_per_gpu(seven_b: Path) -> None:
    weights = model_bytes(EngineConfig(str(seven_b)))
    assert weights is not None
    assert 14 * GIB < weights < 19 * GIB  # about 8.3 billion parameters in bf16
    layout = choose_layout(EngineConfig(str(seven_b)), gpus(2))
    assert layout.replicas == 2
    assert layout.tensor_parallel == 1
    assert layout.devices() == ["0", "1"]
    assert "fit one GPU" in layout.describe()


def test_a_model_too_large_for_one_gpu_gets_the_smallest_group_that_holds_it(
    seven_b: Path,
) -> None:
    # On 24 GiB cards, 16 GiB of weights need two of them (half of each for the rest);
    # four cards make two such engines.
    layout = choose_layout(EngineConfig(str(seven_b)), gpus(4, 24 * GIB))
    assert (layout.tensor_parallel, layout.replicas) == (2, 2)
    assert layout.devices() == ["0,1", "2,3"]
    assert "encoder data-parallel" in layout.reason


def test_an_explicit_parallel_size_and_gpu_count_win(seven_b: Path) -> None:
    config = EngineConfig(str(seven_b), {"tensor_parallel_size": 2})
    layout = choose_layout(config, gpus(2))
    assert (layout.tensor_parallel, layout.replicas) == (2, 1)
    assert "as asked" in layout.reason
    one = choose_layout(EngineConfig(str(seven_b), gpus=1), gpus(2))
    assert one.devices() == ["0"]
    with pytest.raises(ConfigError, match="only 2 GPU"):
        choose_layout(EngineConfig(str(seven_b), gpus=3), gpus(2))


def test_without_gpus_one_engine_runs_here(seven_b: Path) -> None:
    layout = choose_layout(EngineConfig(str(seven_b)), [])
    assert layout.replicas == 1
    assert layout.devices() == [None]
    assert "no GPU" in layout.describe()


def test_several_engines_share_a_gpu_each_with_its_share_of_memory(seven_b: Path) -> None:
    layout = choose_layout(EngineConfig(str(seven_b), engines_per_gpu=3), gpus(1))
    assert layout.devices() == ["0", "0", "0"]
    assert layout.per_gpu == 3
    assert "3 on each of 1 GPU" in layout.describe()
    kwargs = layout.engine_kwargs({"max_model_len": 2048})
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.3)
    # A KV cache of a set size: profiling the device's free memory would count the other
    # engines starting beside it. What the share leaves beside the weights and a reserve.
    weights = model_bytes(EngineConfig(str(seven_b)))
    assert weights is not None
    share = 0.3 * H200
    assert kwargs["kv_cache_memory_bytes"] == layout.kv_cache_bytes
    assert 0 < kwargs["kv_cache_memory_bytes"] <= share - weights - 6 * GIB
    # Two GPUs, two engines each: every GPU gets one before any gets a second.
    two = choose_layout(EngineConfig(str(seven_b), engines_per_gpu=2), gpus(2))
    assert two.devices() == ["0", "1", "0", "1"]


def test_a_large_job_gets_two_engines_per_gpu_where_they_fit(seven_b: Path) -> None:
    from mmbatch.engine.layout import ONE_ENGINE_REQUESTS

    config = EngineConfig(str(seven_b))
    large, small = ONE_ENGINE_REQUESTS + 1, ONE_ENGINE_REQUESTS
    layout = choose_layout(config, gpus(1), requests=large)
    assert layout.devices() == ["0", "0"]
    assert f"the default for over {ONE_ENGINE_REQUESTS} requests" in layout.describe()
    # A job one engine holds at once, or of unknown size (a Dataset.map's batches): one.
    assert choose_layout(config, gpus(1), requests=small).devices() == ["0"]
    assert choose_layout(config, gpus(1)).devices() == ["0"]
    # Where a second engine would leave each less KV cache than its weights: one.
    assert choose_layout(config, gpus(1, 80 * GIB), requests=large).devices() == ["0"]
    # Without a GPU the cores are the bound already: one engine, whatever the job.
    assert choose_layout(config, [], requests=large).devices() == [None]


def test_engines_run_uncompiled_whatever_the_jobs_size_unless_the_user_decides(
    seven_b: Path,
) -> None:
    config = EngineConfig(str(seven_b))
    # A lone engine captures decode graphs, without torch.compile, up to the job's size, and
    # at most vLLM's largest batch: a job of thousands, or of unknown size (a Dataset.map's
    # batches), captures up to 1,024.
    for requests in (1024, 3000, 100_000, None):
        alone = choose_layout(config, gpus(1, 80 * GIB), requests=requests)
        assert alone.replicas == 1
        assert alone.uncompiled
        assert alone.engine_kwargs({}) == {
            "compilation_config": {
                "mode": 0,
                "cudagraph_mode": "FULL_DECODE_ONLY",
                "max_cudagraph_capture_size": 1024,
            }
        }
        assert "decode graphs, uncompiled" in alone.describe()
        assert alone.plainly() == "1 engine on 1 GPU; starts without compiling"
    # ... rounded up to one of vLLM's capture sizes, so that the job's largest batch has one.
    for requests, largest in ((600, 608), (32, 32), (3, 16), (0, 16)):
        small = choose_layout(config, gpus(1), requests=requests).engine_kwargs({})
        assert small["compilation_config"]["max_cudagraph_capture_size"] == largest
    # Per engine: two engines on a GPU share the job, and run eager, short job or long.
    for requests in (2048, 20_000):
        shared = choose_layout(config, gpus(1), requests)
        assert shared.replicas == 2
        assert shared.requests_per_engine == requests // 2
        assert shared.engine_kwargs({})["enforce_eager"] is True
        assert "compilation_config" not in shared.engine_kwargs({})
        assert "eager, uncompiled" in shared.describe()
    # The CPU has no graphs to capture: eager.
    assert choose_layout(config, [], requests=8).engine_kwargs({}) == {"enforce_eager": True}
    assert choose_layout(config, []).engine_kwargs({}) == {"enforce_eager": True}
    # The user's own choice stands, either way, and is not said to be the layout's.
    for setting in ({"enforce_eager": False}, {"compilation_config": {"mode": 3}}):
        for requests in (8, 20_000, None):
            asked = choose_layout(EngineConfig(str(seven_b), setting), gpus(1, 80 * GIB), requests)
            assert not asked.uncompiled
            assert asked.engine_kwargs(setting) == setting
            assert "uncompiled" not in asked.describe()
            assert "without compiling" not in asked.plainly()


def test_one_engine_in_process_is_laid_out_for_its_job_as_a_commands_are(seven_b: Path) -> None:
    from mmbatch.engine.layout import in_process_layout

    config = EngineConfig(str(seven_b))
    # On a GPU (the first), decode graphs up to the job's size; on the CPU, eager.
    on_gpu = in_process_layout(config, gpus(2), 32)
    assert on_gpu.devices() == ["0"]
    assert on_gpu.engine_kwargs({})["compilation_config"]["max_cudagraph_capture_size"] == 32
    assert in_process_layout(config, [], 2).engine_kwargs({}) == {"enforce_eager": True}
    large = in_process_layout(config, gpus(1), 5000).engine_kwargs({})
    assert large["compilation_config"]["max_cudagraph_capture_size"] == 1024
    # The user's own choice stands.
    asked = {"enforce_eager": False}
    assert in_process_layout(EngineConfig(str(seven_b), asked), [], 2).engine_kwargs(asked) == asked


def test_a_users_memory_share_is_the_gpus_and_their_kv_cache_is_kept(seven_b: Path) -> None:
    config = EngineConfig(
        str(seven_b),
        {"gpu_memory_utilization": 0.8, "kv_cache_memory_bytes": GIB},
        engines_per_gpu=2,
    )
    kwargs = choose_layout(config, gpus(1)).engine_kwargs(config.engine_kwargs)
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.4)
    assert kwargs["kv_cache_memory_bytes"] == GIB
    # One engine per GPU: the user's settings go to vLLM as they are.
    one = choose_layout(EngineConfig(str(seven_b)), gpus(1))
    assert one.engine_kwargs({"gpu_memory_utilization": 0.8})["gpu_memory_utilization"] == 0.8
    assert "kv_cache_memory_bytes" not in one.engine_kwargs({})


def test_engines_per_gpu_that_cannot_be_are_refused(seven_b: Path) -> None:
    with pytest.raises(ConfigError, match="leave no KV cache"):
        choose_layout(EngineConfig(str(seven_b), engines_per_gpu=6), gpus(1, 80 * GIB))
    config = EngineConfig(str(seven_b), {"tensor_parallel_size": 2}, engines_per_gpu=2)
    with pytest.raises(ConfigError, match="tensor_parallel_size 2"):
        choose_layout(config, gpus(2))
    with pytest.raises(ConfigError, match="do not fit one GPU"):
        choose_layout(EngineConfig(str(seven_b), engines_per_gpu=2), gpus(4, 24 * GIB))
    with pytest.raises(ConfigError, match="size is unknown"):
        choose_layout(EngineConfig("Qwen/Qwen2.5-VL-7B-Instruct", engines_per_gpu=2), gpus(1))
    with pytest.raises(ConfigError, match="engines_per_gpu must be >= 1"):
        EngineConfig(str(seven_b), engines_per_gpu=0)
    # Without a GPU, the engines asked for run on this machine's cores.
    cpu = choose_layout(EngineConfig(str(seven_b), engines_per_gpu=2), [])
    assert cpu.devices() == [None, None]
    assert cpu.engine_kwargs({}) == {"enforce_eager": True}  # eager, as on the CPU always
    assert "2 engines on this machine" in cpu.describe()


def test_the_parameter_estimate_counts_a_vision_tower(seven_b: Path) -> None:
    settings = json.loads((seven_b / "config.json").read_text())
    text_only = {k: v for k, v in settings.items() if k != "vision_config"}
    assert parameters(settings) - parameters(text_only) > 0.5e9  # the 7B's ViT: ~0.67B


# -- a job on several engine processes --------------------------------------------------


class RoutedReplicas(ReplicaEngine):
    """Notes which replica each request went to (the engines run in other processes)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.sent: dict[str, list[int]] = {}
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _send_to(self, replica, flight):  # type: ignore[no-untyped-def]
        self.sent.setdefault(flight.request.id, []).append(replica.index)
        super()._send_to(replica, flight)


def run(requests: list[Request], engine: ReplicaEngine) -> list[dict]:  # type: ignore[type-arg]
    sink = MemorySink()
    run_requests(requests, engine, MediaOptions(), sink, Sampling(), RunConfig(progress=False))
    return sink.rows


def fakes(count: int, step_seconds: float = 0.01, **kwargs: object) -> RoutedReplicas:
    factory = partial(FakeEngine, per_step=2, step_seconds=step_seconds, capacity=8, **kwargs)
    return RoutedReplicas(factory, [None] * count)


def test_two_replicas_share_the_work_and_keep_an_images_requests_together(
    tmp_path: Path,
) -> None:
    requests = caption_requests(write_pictures(tmp_path / "p", 24), ["a", "b", "c"])  # prompt-major
    # Steps of 50 ms: the job lasts about a second, so that a replica process a loaded machine
    # leaves waiting for a moment still does its share (at 10 ms, the job took 0.2 s).
    engine = fakes(2, step_seconds=0.05)
    try:
        rows = run(requests, engine)
    finally:
        engine.close()
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in requests)
    for row in rows:
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])
    # Work left decides: both engines took a fair share, not one all of it.
    placed = [where[-1] for where in engine.sent.values()]
    assert min(placed.count(0), placed.count(1)) >= len(requests) // 4
    # An image's three prompts (planned together) went to one engine, whose caches hold it.
    by_picture: dict[str, set[int]] = {}
    for request_id, where in engine.sent.items():
        by_picture.setdefault(request_id.split(":")[-1], set()).add(where[-1])
    together = sum(1 for replicas in by_picture.values() if len(replicas) == 1)
    assert together >= 0.8 * len(by_picture)


def test_a_replica_killed_mid_job_loses_and_repeats_no_row(tmp_path: Path) -> None:
    """Killed alone, an engine process leaves its engine core (vLLM's is a child that does
    not watch it): the job ends that with it at once, and starts another replica."""
    requests = caption_requests(write_pictures(tmp_path / "p", 40), ["a", "b"])
    engine = fakes(2, lifecycle=Lifecycle(engine_core=True))
    done = threading.Event()
    left: list[list[str]] = []

    def kill_one() -> None:
        while not done.is_set() and sum(len(r.held) for r in engine._replicas) < 10:
            time.sleep(0.01)
        victim = engine._replicas[0].process
        if victim is not None:
            group = [victim.pid, *children(victim.pid)]
            os.kill(victim.pid, signal.SIGKILL)
            left.append(left_after(lambda: [pid for pid in group if alive(pid)], 2.0))

    killer = threading.Thread(target=kill_one)
    killer.start()
    try:
        rows = run(requests, engine)
    finally:
        done.set()
        killer.join()
        engine.close()
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in requests)  # each once
    assert all(row["error"] is None for row in rows)
    for row in rows:
        assert row["text"] == expected_text([row["media_hash"]], row["prompt"])
    retried = [where for where in engine.sent.values() if len(where) == 2]
    assert retried  # the killed replica's requests went again, once
    assert left == [[]], f"the killed replica's group lived on: {left}"


class KilledOnce(ReplicaEngine):
    """Kills the process of the replica it sends its ``at``-th request to (SIGKILL, as the
    kernel's out-of-memory killer would), once: a crash at a known point of the job."""

    def __init__(self, at: int, *args: object, **kwargs: object) -> None:
        self.sends_left = at
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _send_to(self, replica, flight):  # type: ignore[no-untyped-def]
        super()._send_to(replica, flight)
        self.sends_left -= 1
        if self.sends_left == 0:
            os.kill(replica.process.pid, signal.SIGKILL)


LOAD_SECONDS = 0.5
"""How long the fake engine takes to start (a model loaded: minutes on a GPU)."""


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_restarts_start_up_is_counted_apart_from_the_work(tmp_path: Path, replicas: int) -> None:
    """An engine started again after its process died loads its model again: the run counts
    that start-up as a restart (``restarts``, ``restart_seconds``), and its work's time and
    speed leave it out, as they leave out the job's own start-up. One engine of two
    restarting holds half of the job's engines: half its seconds count."""
    requests = caption_requests(write_pictures(tmp_path / "p", 12), ["a"])
    loading = Lifecycle(start_seconds=LOAD_SECONDS)
    make = partial(FakeEngine, per_step=2, capacity=8, lifecycle=loading)
    engine = KilledOnce(4, make, [None] * replicas)
    sink = MemorySink()
    try:
        stats = run_requests(
            requests, engine, MediaOptions(), sink, Sampling(), RunConfig(progress=False)
        )
    finally:
        engine.close()
    assert sorted(r["id"] for r in sink.rows) == sorted(r.id for r in requests)
    assert all(row["error"] is None for row in sink.rows)
    assert stats.restarts == 1
    assert stats.finished is not None
    elapsed = stats.finished - stats.started
    assert stats.wall_seconds == pytest.approx(elapsed - stats.restart_seconds)
    if replicas == 1:  # every request waited for the model to load again
        assert stats.restart_seconds >= LOAD_SECONDS
    else:  # the other engine went on working: half of the run's seconds at most
        assert 0 < stats.restart_seconds <= elapsed / 2
    figures = stats.to_dict()
    assert figures["restarts"] == 1
    assert figures["items_per_second"] == pytest.approx(len(requests) / stats.wall_seconds, 0.01)
    assert "restarts: 1 engine started again" in stats.summary()


def job_of_its_own(script: str) -> subprocess.Popen[bytes]:
    """``script`` run as a job in a session of its own, importing what this test imports,
    its output piped."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, start_new_session=True
    )


def test_the_engine_processes_of_a_job_killed_while_they_start_end_with_it() -> None:
    """SIGKILL of the job while its engines load their models (the worst case: nothing
    stops them, and the GPU stays full): each replica ends its whole group (here the
    stand-in for vLLM's engine core) within two seconds."""
    script = (
        "from functools import partial\n"
        "from mmbatch.engine.replicas import ReplicaEngine\n"
        "from fake_engine import FakeEngine, Lifecycle\n"
        "if __name__ == '__main__':\n"
        "    slow = Lifecycle(engine_core=True, start_seconds=60)\n"
        "    ReplicaEngine(partial(FakeEngine, lifecycle=slow), [None, None])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    job = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    with job:
        deadline = time.monotonic() + 60
        while len([c for r in group_leaders(children(job.pid)) for c in children(r)]) < 2:
            assert job.poll() is None
            assert time.monotonic() < deadline, "the replicas did not start"
            time.sleep(0.02)
        job.kill()
    assert not left_after(partial(in_session, job.pid), 2.0)


def test_ctrl_c_held_back_while_a_replica_starts_ends_the_replicas_started() -> None:
    """Ctrl-C while a replica's process starts is held back (SIGINT blocked, so that the
    replica never sees it) and taken as the start returns: the replica just started, and
    any before it, end with the job, which exits at once instead of waiting at the
    interpreter's exit for a replica that waits for it."""
    script = (
        "import multiprocessing, os, signal\n"
        "from functools import partial\n"
        "from multiprocessing.context import SpawnProcess\n"
        "from mmbatch.engine.replicas import ReplicaEngine\n"
        "from fake_engine import FakeEngine, Lifecycle\n"
        "started = SpawnProcess.start\n"
        "def start_then_ctrl_c(process):\n"
        "    started(process)\n"
        "    if process.name.endswith('-1'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # held back while it starts\n"
        "if __name__ == '__main__':\n"
        "    SpawnProcess.start = start_then_ctrl_c\n"
        "    slow = Lifecycle(start_seconds=60)\n"
        "    try:\n"
        "        ReplicaEngine(partial(FakeEngine, lifecycle=slow), [None, None, None])\n"
        "    except KeyboardInterrupt:\n"
        "        print(len(multiprocessing.active_children()), flush=True)\n"
    )
    job = job_of_its_own(script)
    with job:
        try:
            out, _ = job.communicate(timeout=60)
        finally:
            for pid in in_session(job.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert out.decode().split() == ["0"]  # the two replicas started are gone
    assert job.returncode == 0
    assert not left_after(partial(in_session, job.pid), 2.0)


def test_the_helpers_of_a_killed_job_end_while_the_workers_it_forked_live() -> None:
    """SIGKILL of a job that forked a worker (as ``Dataset.map(num_proc=...)`` does) while
    its engine process loads its model and its decode workers wait: each ends within
    seconds, with the engine's group (the stand-in for vLLM's engine core), not when the
    worker ends; the worker, a copy of the job, holds no copy of what they watch."""
    script = (
        "import multiprocessing, os, threading, time\n"
        "from functools import partial\n"
        "from mmbatch.engine.replicas import ReplicaEngine\n"
        "from mmbatch.media.decoders import start_decoders\n"
        "from fake_engine import FakeEngine, Lifecycle\n"
        "if __name__ == '__main__':\n"
        "    start_decoders(1)\n"
        "    slow = Lifecycle(engine_core=True, start_seconds=120)\n"
        "    make = partial(FakeEngine, lifecycle=slow)\n"
        "    threading.Thread(target=ReplicaEngine, args=(make, [None]), daemon=True).start()\n"
        "    while len(multiprocessing.active_children()) < 2:\n"
        "        time.sleep(0.02)\n"
        "    helpers = [p.pid for p in multiprocessing.active_children()]\n"
        "    worker = os.fork()\n"
        "    if worker == 0:\n"
        "        time.sleep(120)\n"
        "        os._exit(0)\n"
        "    print(worker, *helpers, flush=True)\n"
        "    time.sleep(120)\n"
    )
    job = job_of_its_own(script)
    with job:
        assert job.stdout is not None
        worker, *helpers = map(int, job.stdout.readline().split())
        try:
            deadline = time.monotonic() + 60
            while not (core := [c for r in group_leaders(helpers) for c in children(r)]):
                assert time.monotonic() < deadline, "the engine process did not start"
                time.sleep(0.02)
            started = [*helpers, *core]
            job.kill()
            # Generous against a loaded machine: they lived on for as long as the worker
            # (120 s) where it kept copies of the job's ends of their pipes.
            assert not left_after(lambda: [pid for pid in started if running(pid)], 45.0)
            assert running(worker)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
    assert not left_after(partial(in_session, job.pid), 10.0)


def test_a_job_ending_normally_ends_its_one_gpu_engines_without_waiting_for_their_teardown() -> (
    None
):
    """Every row is safe when the interpreter exits: engines that share no memory with
    workers of their own (one GPU each) are ended at once, not waited for."""
    script = (
        "from functools import partial\n"
        "from mmbatch.engine.replicas import ReplicaEngine\n"
        "from fake_engine import FakeEngine, Lifecycle\n"
        "if __name__ == '__main__':\n"
        "    make = partial(FakeEngine, lifecycle=Lifecycle(engine_core=True, close_seconds=60))\n"
        "    ReplicaEngine(make, [None, None], end_at_exit=True)\n"
        "    print('ready', flush=True)\n"
    )
    job = job_of_its_own(script)
    with job:
        assert job.stdout is not None
        assert job.stdout.readline() == b"ready\n"
        ready = time.monotonic()
        assert job.wait(timeout=40) == 0
        assert time.monotonic() - ready < 40  # not the 60 s each engine's close would take
    assert not left_after(partial(in_session, job.pid), 2.0)


@pytest.mark.timeout(60)
def test_a_request_an_engine_process_loses_stops_the_job_loudly(tmp_path: Path) -> None:
    """A replica whose engine forgets a request (it holds nothing, yet never returned it)
    says so, and the pipeline stops the job saying which, instead of waiting forever."""
    requests = caption_requests(write_pictures(tmp_path / "p", 12), ["fine"])
    lost = Request("lost", "lose", (MediaRef("image", requests[3].media[0].source),))
    engine = fakes(2, faults=Faults(drop_prompts=frozenset({"lose"})))
    try:
        with pytest.raises(FatalEngineError, match=r"got no result \(e\.g\. 'lost'\)"):
            run([*requests, lost], engine)
    finally:
        engine.close()


def test_a_request_that_kills_every_engine_it_reaches_costs_one_row(tmp_path: Path) -> None:
    requests = caption_requests(write_pictures(tmp_path / "p", 12), ["fine"])
    poison = Request("poison", "crash", (MediaRef("image", requests[3].media[0].source),))
    engine = fakes(2, faults=Faults(crash_on_prompt="crash"))
    try:
        rows = run([*requests, poison], engine)
    finally:
        engine.close()
    by_id = {row["id"]: row for row in rows}
    assert len(by_id) == len(rows) == 13
    assert by_id["poison"]["error"]["kind"] == "engine"
    assert "died each time this request was in it" in by_id["poison"]["error"]["message"]
    assert all(by_id[r.id]["error"] is None for r in requests)


def test_a_request_that_makes_the_engine_step_raise_costs_one_row(tmp_path: Path) -> None:
    """An exception out of the engine's ``step`` (a vLLM bug one request sets off) ends that
    replica as a crash would: restarted, the request found by halving, one error row."""
    requests = caption_requests(write_pictures(tmp_path / "p", 12), ["fine"])
    poison = Request("poison", "bad", (MediaRef("image", requests[5].media[0].source),))
    engine = fakes(1, faults=Faults(raise_on_prompt="bad"))
    try:
        rows = run([requests[0], poison, *requests[1:]], engine)
    finally:
        engine.close()
    by_id = {row["id"]: row for row in rows}
    assert len(by_id) == len(rows) == 13
    assert by_id["poison"]["error"]["kind"] == "engine"
    assert "RuntimeError" in by_id["poison"]["error"]["message"]
    assert all(by_id[r.id]["error"] is None for r in requests)
    for r in requests:
        assert by_id[r.id]["text"] == expected_text([by_id[r.id]["media_hash"]], "fine")


def test_an_engine_that_dies_whatever_it_is_given_stops_the_job(tmp_path: Path) -> None:
    """Bisection narrows down a killer; it does not retry a broken engine for every request:
    deaths without a result between them stop the job after a few restarts."""
    requests = caption_requests(write_pictures(tmp_path / "p", 16), ["fine"])
    engine = fakes(1, faults=Faults(die_after_steps=0))
    try:
        with pytest.raises(FatalEngineError, match="died 4 times without finishing"):
            run(requests, engine)
    finally:
        engine.close()


@pytest.mark.slow
def test_two_vllm_engines_give_each_id_the_text_one_engine_gives(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    samples: Path,
) -> None:
    from mmbatch.engine.builder import read_host, start_engine
    from mmbatch.engine.layout import Layout

    names = ["sunset.jpg", "checkerboard.png", "shapes_alpha.png", "arrow_exif_rotated.jpg"]
    requests = [
        Request(f"{p}:{n}", prompt, (MediaRef("image", str(samples / n)),))
        for p, prompt in enumerate(["Describe.", "Tags?", "Colours?"])
        for n in names
    ]
    sampling = Sampling(max_tokens=8)
    one = MemorySink()
    run_requests(requests, vl_engine, MediaOptions(), one, sampling, RunConfig(progress=False))
    config = EngineConfig(str(tiny_vl_model), TINY_ENGINE_KWARGS)
    engine = start_engine(read_host(config), {"image": 1}, Layout(1, ((), ()), "two CPU engines"))
    assert isinstance(engine, ReplicaEngine)
    try:
        two = MemorySink()
        run_requests(requests, engine, MediaOptions(), two, sampling, RunConfig(progress=False))
        assert engine.prompt_limits() is not None  # measured against the replicas' limits
    finally:
        engine.close()
    expected = {row["id"]: (row["text"], row["error"]) for row in one.rows}
    assert {row["id"]: (row["text"], row["error"]) for row in two.rows} == expected


# -- the replica's side of the pipe, run here in a thread (a replica process runs the same
# loop, where coverage does not follow it) -----------------------------------------------


def serving(
    engine: FakeEngine, queued: Sequence[tuple[Any, ...]] = ()
) -> tuple[Connection, threading.Thread]:
    """The parent's end of a pipe whose other end ``_serve_engine`` serves ``engine`` on;
    ``queued``: messages sent before it starts, so that it finds them all waiting."""
    parent, child = multiprocessing.Pipe()
    for message in queued:
        parent.send(message)
    loop = threading.Thread(target=_serve_engine, args=(engine, child), daemon=True)
    loop.start()
    return parent, loop


def text_request(request_id: str, prompt: str) -> LoadedRequest:
    return LoadedRequest(Request(request_id, prompt), ())


def replies(parent: Connection, until: Callable[[list[Any]], bool]) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 60  # a liveness bound: replies come in milliseconds
    while not until(got):
        assert time.monotonic() < deadline, f"no such reply within 60 s: {got}"
        if parent.poll(0.1):
            got.append(parent.recv())
    return got


def results_in(messages: list[Any]) -> dict[str, Any]:
    return {r.request_id: r for m in messages if m[0] == "results" for r in m[1]}


def test_a_replica_adds_steps_reports_and_stops_when_told() -> None:
    engine = FakeEngine(per_step=1, faults=Faults(reject_prompts=frozenset({"no"})))
    parent, loop = serving(engine)
    for request_id, prompt in [("a", "hi"), ("b", "no"), ("c", "there")]:
        parent.send(("add", text_request(request_id, prompt), [], Sampling()))
    got = replies(parent, lambda got: len(results_in(got)) == 3)
    done = results_in(got)
    assert done["a"].text == expected_text([], "hi")
    assert done["c"].text == expected_text([], "there")
    error = done["b"].error  # refused on add
    assert error is not None
    assert error.stage == "validate"
    _, _, capacity, _, depths = got[-1]
    assert capacity == engine.capacity()
    assert depths == (0, 0)
    parent.send(("stop",))
    loop.join(timeout=10)
    assert not loop.is_alive()


class CountedStats(FakeEngine):
    """Counts its counter reads (vLLM's: milliseconds of Python each), each with the replica
    loop's clock (``clock``: its last reading) and the requests it held then."""

    def __init__(self, clock: list[float]) -> None:
        # A step as slow as a small model's: the replica's receiving thread keeps ahead of it.
        super().__init__(per_step=1, step_seconds=0.02)
        self.clock = clock
        self.reads: list[tuple[float, int]] = []

    def cache_stats(self) -> CacheStats:
        self.reads.append((self.clock[-1], self.num_unfinished()))
        return CacheStats(prefix_queries=len(self.reads))


def test_a_replica_reads_its_engines_counters_now_and_then_and_when_it_runs_dry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mmbatch.engine import replicas

    clock: list[float] = []

    def reading() -> float:
        clock.append(time.monotonic())
        return clock[-1]

    monkeypatch.setattr(replicas, "time", SimpleNamespace(monotonic=reading, sleep=time.sleep))
    engine = CountedStats(clock)
    # All waiting from the start: sent one by one, each could be served before the next
    # arrived, the replica running dry (and reading, as it should) after every one.
    adds = [("add", text_request(f"r{i}", "hi"), [], Sampling()) for i in range(40)]
    parent, loop = serving(engine, adds)
    got = replies(parent, lambda got: len(results_in(got)) == 40)
    reports = [m for m in got if m[0] == "results" and m[1]]
    assert len(reports) == 40  # a step per request, each a report of its own
    # Each read but the first came once the engine held nothing, or STATS_SECONDS after the
    # one before by the replica's own clock: not at every report, however fast they come.
    for (before, _), (at, held) in zip(engine.reads, engine.reads[1:], strict=False):
        assert held == 0 or at - before >= replicas.STATS_SECONDS, engine.reads
    assert got[-1][3].prefix_queries == len(engine.reads)  # read afresh once it had nothing left
    parent.send(("stop",))
    loop.join(timeout=10)


def test_a_replica_stops_by_itself_when_the_parent_is_gone() -> None:
    parent, loop = serving(FakeEngine(per_step=1))
    parent.send(("add", text_request("a", "hi"), [], Sampling()))
    replies(parent, lambda got: "a" in results_in(got))
    parent.close()
    loop.join(timeout=10)
    assert not loop.is_alive()


def test_a_replica_whose_step_raises_says_why_and_stops() -> None:
    parent, loop = serving(FakeEngine(faults=Faults(raise_on_prompt="bad")))
    parent.send(("add", text_request("x", "bad"), [], Sampling()))
    [fatal] = replies(parent, lambda got: bool(got) and got[-1][0] == "fatal")[-1:]
    assert "its step raised RuntimeError" in fatal[1]
    loop.join(timeout=10)
    assert not loop.is_alive()


def test_a_replica_whose_engine_dies_says_so_and_stops() -> None:
    parent, loop = serving(FakeEngine(faults=Faults(die_after_steps=0)))
    parent.send(("add", text_request("x", "hi"), [], Sampling()))
    [fatal] = replies(parent, lambda got: bool(got) and got[-1][0] == "fatal")[-1:]
    assert fatal[1] == "the fake engine died"
    loop.join(timeout=10)
    assert not loop.is_alive()


def slow_to_start_fake() -> FakeEngine:
    time.sleep(120)  # loading a model
    return FakeEngine(per_step=2, step_seconds=0.01, capacity=8)


def test_the_settings_are_checked_while_the_replicas_start(tmp_path: Path) -> None:
    """Both the check and each replica import vLLM (15 s on a GPU host): the check runs while
    the replica processes start, and the engine works once it passes."""
    before = set(multiprocessing.active_children())
    starting: list[int] = []

    def check() -> None:
        starting.extend(p.pid for p in set(multiprocessing.active_children()) - before)

    requests = caption_requests(write_pictures(tmp_path / "p", 4), ["a"])
    engine = ReplicaEngine(partial(FakeEngine, per_step=2, capacity=8), [None, None], None, check)
    try:
        rows = run(requests, engine)
    finally:
        engine.close()
    assert len(starting) >= 2  # the two replicas were up and starting during the check
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in requests)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def fake_with_a_child(pids: Any, closing: Any, closed: Any) -> FakeEngine:
    """A fake engine that, as vLLM's does, starts a process of its own (in the replica's
    process group) that would outlive it, and whose close waits for the other replica's
    (``closing``, a barrier of two; 20 s at most, well within the replicas' time to stop):
    ``closed`` gets whether the two closes ran at once."""
    import subprocess
    import threading

    child = subprocess.Popen(["sleep", "600"])
    pids.put(child.pid)
    engine = FakeEngine(per_step=2, step_seconds=0.01, capacity=8)

    def close() -> None:
        try:
            closing.wait(timeout=20)
            closed.put(True)
        except threading.BrokenBarrierError:  # the other closes before or after this one
            closed.put(False)

    engine.close = close  # type: ignore[method-assign]
    return engine


def test_closing_stops_every_replica_together_and_leaves_nothing_they_started(
    tmp_path: Path,
) -> None:
    spawn = multiprocessing.get_context("spawn")
    pids, closing, closed = spawn.Queue(), spawn.Barrier(2), spawn.Queue()
    before = set(multiprocessing.active_children())  # a shared engine's replicas may live on
    engine = ReplicaEngine(partial(fake_with_a_child, pids, closing, closed), [None, None])
    children = [pids.get(timeout=30), pids.get(timeout=30)]
    replicas = [p.pid for p in set(multiprocessing.active_children()) - before]
    assert len(replicas) == 2
    rows = run(caption_requests(write_pictures(tmp_path, 4), ["Describe."]), engine)
    assert len(rows) == 4
    engine.close()
    # both engines closed at once: each close met the other's, not one after the other
    assert [closed.get(timeout=30), closed.get(timeout=30)] == [True, True]
    assert not [pid for pid in [*children, *replicas] if running(pid)]
    for queue in (pids, closed):
        queue.close()
        queue.join_thread()


def test_a_shared_engine_is_kept_until_it_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry gives every ask with the same settings the same engine, and drops it
    through the engine's close hook when it closes: the next ask builds another. The engine
    knows nothing of the registry."""
    from mmbatch.engine import builder, registry
    from mmbatch.engine.layout import Layout

    built: list[ReplicaEngine] = []

    def build(*_: object) -> ReplicaEngine:
        built.append(fakes(1))
        return built[-1]

    monkeypatch.setattr(builder, "start_engine", build)
    host, media = builder.Host(EngineConfig("org/kept"), ()), {"image": 1}
    layout = Layout(1, ((),), "one")

    def ask() -> object:
        return registry.shared_engine_and_layout(host, media, layout)[0]

    first = ask()
    try:
        assert ask() is first
        assert len(built) == 1
        kept = registry.shared_engine_and_layout(host, media, replace(layout, reason="new"))[1]
        assert kept.describe() == f"one engine on this machine (one; {registry.KEPT})"
    finally:
        built[0].close()
    try:
        second = ask()
        assert second is not first
        assert len(built) == 2
        built[0].close()  # closed again (as at exit): the engine built since is kept
        assert ask() is second
    finally:
        built[1].close()
    try:
        assert ask() is built[2]
    finally:
        built[2].close()


def in_a_forked_child(inherited: ReplicaEngine, config: EngineConfig, lookahead: int) -> None:
    """What a ``Dataset.map(num_proc=...)`` worker forked from a process that ran jobs finds:
    none of the parent's engines, pipelines or look-ahead; and closing its copy of the
    parent's engine (what its exit handler does) ends nothing of the parent's."""
    from mmbatch import pipeline
    from mmbatch.engine import registry
    from mmbatch.integrations import hf_datasets

    assert registry.kept_engine(config, {"image": 1}) is None
    with pipeline._PIPELINES.locked() as pipelines:
        assert not pipelines
    assert id(hf_datasets._LOOKAHEAD) != lookahead
    inherited.close()
    inherited._abandon()


def test_a_forked_child_forgets_the_parents_engine_and_never_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmbatch.engine import builder, registry
    from mmbatch.engine.layout import Layout
    from mmbatch.integrations import hf_datasets
    from mmbatch.jobs import Job, run_in_memory

    monkeypatch.setattr(builder, "start_engine", lambda *_: fakes(1))
    host, media = builder.Host(EngineConfig("org/forked"), ()), {"image": 1}
    engine = registry.shared_engine_and_layout(host, media, Layout(1, ((),), "one"))[0]
    assert isinstance(engine, ReplicaEngine)
    try:
        job = Job(caption_requests(write_pictures(tmp_path, 2), ["Describe."]), Sampling())
        assert len(run_in_memory(job, engine)[0]) == 2  # its pipeline kept for the next
        [replica] = [r.process.pid for r in engine._replicas]
        child = multiprocessing.get_context("fork").Process(
            target=in_a_forked_child, args=(engine, host.config, id(hf_datasets._LOOKAHEAD))
        )
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        assert running(replica)
        assert [r.process.pid for r in engine._replicas] == [replica]
        assert registry.kept_engine(host.config, media) is engine
        rows, _ = run_in_memory(job, engine)
        assert sorted(r["text"] for r in rows) == sorted(
            expected_text([r["media_hash"]], r["prompt"]) for r in rows
        )
    finally:
        engine.close()


def test_a_mistake_found_while_the_replicas_start_ends_them_at_once() -> None:
    before = set(multiprocessing.active_children())
    starting: list[multiprocessing.Process] = []

    def check() -> None:
        starting.extend(set(multiprocessing.active_children()) - before)
        raise ConfigError("max_model_len 99999 is longer than the model's 2048")

    began = time.monotonic()
    with pytest.raises(ConfigError, match="max_model_len"):
        ReplicaEngine(slow_to_start_fake, [None, None], None, check)
    assert time.monotonic() - began < 60  # ended, not waited for (120 s)
    assert len(starting) >= 2
    assert not any(p.is_alive() for p in starting)
