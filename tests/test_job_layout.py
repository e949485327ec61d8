"""A job given an engine's settings reads the host once: the check that stops a mistake
before any output is written and the layout of the engines it starts come from the same
reading, the layout sized for the work left after resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from picture_requests import caption_requests, write_pictures

from mmbatch.engine import builder, registry
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import Gpu, Layout, choose_layout
from mmbatch.errors import ConfigError
from mmbatch.jobs import Job, run_job
from mmbatch.output.file_output import FileOutput
from mmbatch.pipeline import RunConfig


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the host's GPUs are read (every reading is counted, none is changed)."""
    reads: list[int] = []
    real = builder.visible_gpus

    def counted() -> list[Gpu]:
        reads.append(1)
        return real()

    monkeypatch.setattr(builder, "visible_gpus", counted)
    return reads


def test_a_job_reads_the_host_once_and_lays_out_the_work_left(
    host_reads: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    laid_out: list[Layout] = []

    def engine_for(host: builder.Host, media: Any, layout: Layout) -> tuple[FakeEngine, Layout]:
        laid_out.append(layout)  # the engine is a stand-in: what matters is its layout
        return FakeEngine(), layout

    monkeypatch.setattr(registry, "shared_engine_and_layout", engine_for)
    requests = caption_requests(write_pictures(tmp_path / "in", 3), ["Describe."])
    out = FileOutput.at(tmp_path / "rows.jsonl")
    run_job(Job(requests[:1]), FakeEngine(), out, RunConfig(progress=False))
    assert host_reads == []  # an engine given is not laid out
    config = EngineConfig("org/model")
    report = run_job(Job(requests), config, out, RunConfig(progress=False))
    assert host_reads == [1]
    gpus = builder.visible_gpus()
    assert laid_out == [choose_layout(config, gpus, 2)] != [choose_layout(config, gpus, 3)]
    assert report.output.ok == 3


def test_a_host_that_cannot_run_the_settings_stops_the_job_before_any_output(
    host_reads: list[int], tmp_path: Path
) -> None:
    requests = caption_requests(write_pictures(tmp_path / "in", 1), ["Describe."])
    out = tmp_path / "rows.jsonl"
    many = EngineConfig("org/model", gpus=len(builder.visible_gpus()) + 1)
    with pytest.raises(ConfigError, match="GPU"):
        run_job(Job(requests), many, FileOutput.at(out), RunConfig(progress=False))
    assert host_reads == [1, 1]  # the test's own reading, then the job's
    assert list(tmp_path.iterdir()) == [tmp_path / "in"]
