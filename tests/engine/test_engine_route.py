"""One route to an engine: every face starts its engine through ``builder.start_engine``,
once, on the host its job read once (``read_host``: one reading of the GPUs, batch
invariance's check included), with the model's name checked once per start."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_ENGINE_KWARGS
from fake_engine import FakeEngine
from picture_requests import caption_requests, write_pictures

import mmbatch
from mmbatch.cli import EXIT_OK, main
from mmbatch.engine import builder, config, invariance, layout, registry
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import Gpu, Layout, choose_layout, in_process_layout
from mmbatch.jobs import Job, run_job
from mmbatch.output.file_output import FileOutput
from mmbatch.pipeline import RunConfig, close_pipeline

MODEL = "org/one-route"
"""A hub name: checked by its name only, never fetched (the engine is a stand-in)."""
H100 = Gpu("0", 80 * 1024**3, (9, 0))
QUIET = RunConfig(progress=False, decode_workers=0)
PROMPT = "Describe."
FACE_MODULES = ("mmbatch.cli.caption", "mmbatch.integrations.ray_data", "mmbatch.notebook")


class HeldEngine(FakeEngine):
    """The fake engine, closed by a ``with`` block as a notebook's engine is."""

    def __enter__(self) -> HeldEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Route:
    """What the faces did: each start (its host, media and layout), each reading of the
    GPUs, each check of a model's name."""

    starts: list[tuple[builder.Host, dict[str, int], Layout]] = field(default_factory=list)
    engines: list[FakeEngine] = field(default_factory=list)
    gpu_reads: int = 0
    name_checks: list[str] = field(default_factory=list)


def _replace_everywhere(
    monkeypatch: pytest.MonkeyPatch, real: Callable[..., Any], stand_in: Callable[..., Any]
) -> None:
    """``stand_in`` for ``real`` in every mmbatch module that holds it by name, so that a
    call from any of them is seen, wherever it imported it."""
    for name, module in list(sys.modules.items()):
        if name.startswith("mmbatch") and getattr(module, real.__name__, None) is real:
            monkeypatch.setattr(module, real.__name__, stand_in)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Route:
    """The GPUs read (an H100, which gives batch invariance) and the model's name checked,
    counted wherever a module holds them."""
    for name in FACE_MODULES:  # loaded first, so that the names they hold are replaced too
        importlib.import_module(name)
    seen = Route()
    real_check = config.check_model_name

    def read_gpus() -> list[Gpu]:
        seen.gpu_reads += 1
        return [H100]

    def check(model: str) -> None:
        seen.name_checks.append(model)
        real_check(model)

    _replace_everywhere(monkeypatch, layout.visible_gpus, read_gpus)
    _replace_everywhere(monkeypatch, real_check, check)
    return seen


@pytest.fixture
def route(counted: Route, monkeypatch: pytest.MonkeyPatch) -> Iterator[Route]:
    """``counted``, with the builder's one start replaced by a recorder that returns a fake
    engine."""

    def start(host: builder.Host, media: dict[str, int], laid_out: Layout) -> HeldEngine:
        counted.starts.append((host, media, laid_out))
        counted.engines.append(HeldEngine())
        return counted.engines[-1]

    monkeypatch.setattr(builder, "start_engine", start)
    # Set already: batch invariance's switch then has nothing to do in this process (which
    # may have imported vLLM for another test); the check of the GPUs still runs.
    monkeypatch.setenv(invariance.ENV_VAR, "1")
    monkeypatch.setattr(invariance, "vllm_version", lambda: "0.32.0")
    yield counted
    for key, (engine, _) in list(registry._ENGINES.items()):
        if engine in counted.engines:  # kept by the registry: gone with the test
            del registry._ENGINES[key]
    for engine in counted.engines:
        close_pipeline(engine)  # its feeder and decoders, kept for it


@dataclass(frozen=True)
class Face:
    """A way a user starts an engine, and the layout it must get: one engine in this process
    or not, for a job of ``requests`` (None: unknown)."""

    run: Callable[[Path, pytest.MonkeyPatch], object]
    in_process: bool
    requests: int | None


def _pictures(tmp_path: Path) -> Path:
    write_pictures(tmp_path / "in", 3)
    return tmp_path / "in"


def _cli(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    out = tmp_path / "rows.jsonl"
    argv = ["caption", str(_pictures(tmp_path)), "--model", MODEL, "--out", str(out)]
    assert main([*argv, "--batch-invariant", "--no-progress", "--decode-workers", "0"]) == EXIT_OK
    return out


def _notebook(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    model = EngineConfig(MODEL, batch_invariant=True)
    rows = mmbatch.caption(str(_pictures(tmp_path)), model=model, run=QUIET)
    assert [row["error"] for row in rows] == [None] * 3
    return rows


def _load_engine(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    with mmbatch.load_engine(MODEL) as engine:
        return engine


def _dataset(tmp_path: Path) -> Any:
    import datasets

    cells = [
        {"bytes": path.read_bytes(), "path": path.name} for path in write_pictures(tmp_path, 3)
    ]
    table = datasets.Dataset.from_dict({"image": cells})
    return table.cast_column("image", datasets.Image(decode=False))


def _dataset_map(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    mapped = _dataset(tmp_path).map(mmbatch.DatasetMap(MODEL, PROMPT), batched=True)
    assert list(mapped["error"]) == [""] * 3  # no error in any row
    return mapped


def _run_dataset(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    task = mmbatch.DatasetMap(MODEL, PROMPT)
    done = mmbatch.run_dataset(_dataset(tmp_path), task, cache_dir=tmp_path / "jobs", run=QUIET)
    assert list(done["error"]) == [""] * 3
    return done


def _run_job(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    requests = caption_requests(write_pictures(tmp_path / "in", 3), [PROMPT])
    engine = EngineConfig(MODEL, batch_invariant=True)
    report = run_job(Job(requests), engine, FileOutput.at(tmp_path / "rows.jsonl"), QUIET)
    assert report.output.ok == 3
    return report


def _ray_actor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """Ray's actor class, built as Ray builds it in an actor's process (no cluster needed):
    its engine starts in its constructor."""
    import mmbatch.lifetime
    from mmbatch.integrations.ray_replica import EngineReplica, RayJob

    # Started in the test process it would outlive the test; what it does is not tested here.
    monkeypatch.setattr(mmbatch.lifetime, "orphan_resource_tracker", lambda: None)
    job = RayJob(EngineConfig(MODEL, batch_invariant=True), requests_per_replica=3)
    replica = EngineReplica(job)
    assert replica.failed is None
    assert isinstance(replica.engine, HeldEngine)
    return replica


def _kept_engine(tmp_path: Path, _: pytest.MonkeyPatch) -> object:
    """The kept engine's server (``mmbatch engine start``), which serves jobs of any size."""
    from mmbatch.engine.kept_server import open_kept_engine

    engine, _ = open_kept_engine(EngineConfig(MODEL, batch_invariant=True), {"image": 1})
    return engine


FACES = {
    "mmbatch caption": Face(_cli, in_process=False, requests=3),
    "mmbatch.caption": Face(_notebook, in_process=True, requests=3),
    "load_engine": Face(_load_engine, in_process=True, requests=None),
    "DatasetMap": Face(_dataset_map, in_process=False, requests=3),
    "run_dataset": Face(_run_dataset, in_process=False, requests=3),
    "run_job": Face(_run_job, in_process=False, requests=3),
    "Ray's EngineReplica": Face(_ray_actor, in_process=False, requests=3),
    "mmbatch engine start": Face(_kept_engine, in_process=False, requests=None),
}


@pytest.mark.parametrize("name", list(FACES))
def test_every_face_starts_its_engine_through_the_builder_once_on_one_reading_of_the_host(
    name: str, route: Route, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    face = FACES[name]
    face.run(tmp_path, monkeypatch)
    assert len(route.starts) == 1, route.starts
    host, media, laid_out = route.starts[0]
    assert host.config.model == MODEL
    assert media == {"image": 1}
    assert host.gpus == (H100,)
    # The layout each face has always had: one engine here (a notebook's), or the
    # command's layout for the job's size (a Ray actor's: for its share of the job).
    lay_out = in_process_layout if face.in_process else choose_layout
    assert laid_out == lay_out(host.config, [H100], face.requests)
    assert route.gpu_reads == 1  # batch invariance's check too, where it is asked for
    assert route.name_checks == [MODEL]


@pytest.fixture
def real_checks(counted: Route, monkeypatch: pytest.MonkeyPatch) -> Route:
    """``counted``, the builder's own start with every check of it real and only the engine
    a stand-in: in this process, the fake engine; in engine processes, ``ReplicaEngine``
    replaced by one that runs what it runs meanwhile (the settings' check as vLLM reads
    them, the chat template, the token counts)."""
    from mmbatch.engine import replicas

    monkeypatch.setattr(builder, "open_engine", lambda *_: FakeEngine())

    def engine_processes(*_: object, while_starting: Callable[[], None], **__: object) -> Any:
        while_starting()
        return FakeEngine()

    monkeypatch.setattr(replicas, "ReplicaEngine", engine_processes)
    return counted


@pytest.mark.parametrize("in_process", [True, False], ids=["in this process", "replicas"])
def test_the_model_name_is_checked_once_per_start(
    real_checks: Route, tiny_vl_model: Path, in_process: bool
) -> None:
    model = str(tiny_vl_model)
    host = builder.read_host(EngineConfig(model, TINY_ENGINE_KWARGS), in_process=in_process)
    engine = builder.start_engine(host, {"image": 1}, host.layout(4))
    assert isinstance(engine, FakeEngine)
    assert real_checks.name_checks == [model]
    assert real_checks.gpu_reads == 1


@pytest.mark.parametrize(("share", "engines"), [(2000, 2), (32, 1)])
def test_a_ray_replica_is_laid_out_for_its_share_as_the_local_runner_lays_out_a_job(
    route: Route,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    share: int,
    engines: int,
) -> None:
    """A replica's engines follow its share of the job, as a command's follow the job: a
    4B model's 2,000 requests get two engines on an H100, 32 get one, uncompiled; either
    way in engine processes of the actor, never in its own process, so that an engine that
    dies is started again inside the replica, as a command's is."""
    import mmbatch.lifetime
    from mmbatch.integrations.ray_replica import EngineReplica, RayJob
    from mmbatch.tiny_models import write_real_shape

    monkeypatch.setattr(mmbatch.lifetime, "orphan_resource_tracker", lambda: None)
    model = str(write_real_shape(tmp_path / "g4", "gemma3_4b"))
    EngineReplica(RayJob(EngineConfig(model), requests_per_replica=share))
    ((host, _, laid_out),) = route.starts
    assert laid_out == choose_layout(host.config, [H100], share)
    assert len(laid_out.groups) == engines
    assert not host.in_process
    assert route.gpu_reads == 1
