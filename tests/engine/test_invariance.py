"""Batch-invariant decoding as an option: refused in one line where the platform lacks it,
switched on for the engine's processes before vLLM is imported, and recorded with the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from error_line import one_error
from fake_engine import FakeEngine
from processes import starts_ended

from mmbatch import jobs
from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK, main
from mmbatch.engine import builder, invariance, registry
from mmbatch.engine.config import EngineConfig
from mmbatch.engine.layout import Gpu
from mmbatch.errors import ConfigError

H200 = Gpu("0", 141 * 1024**3, (9, 0))
A100 = Gpu("1", 80 * 1024**3, (8, 0))
T4 = Gpu("2", 16 * 1024**3, (7, 5))


@pytest.fixture
def no_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable unset, and put back as it was after the test (set first, so that the
    monkeypatch records how it was even when it was not set)."""
    monkeypatch.setenv(invariance.ENV_VAR, "0")
    monkeypatch.delenv(invariance.ENV_VAR)


def test_the_mode_is_refused_in_one_line_where_no_gpu_gives_it(
    tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str], no_mode: None
) -> None:
    """Here, a machine without an NVIDIA GPU: before anything is written or imported."""
    out = tmp_path / "out" / "o.jsonl"
    argv = ["caption", str(samples / "sunset.jpg"), "--model", "m", "--out", str(out)]
    code = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mmbatch", *argv, "--batch-invariant"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert code.returncode == EXIT_JOB_FAILED
    errors = [line for line in code.stderr.splitlines() if line.startswith("mmbatch: error:")]
    assert errors == [
        "mmbatch: error: batch-invariant decoding (--batch-invariant, VLLM_BATCH_INVARIANT=1) "
        f"needs an NVIDIA GPU of compute capability "
        f"{'.'.join(map(str, invariance.required_capability(invariance.vllm_version())))} "
        f"or newer (vLLM {invariance.vllm_version()}); none is visible here"
    ]
    imported = {line.split("|")[-1].strip() for line in code.stderr.splitlines() if "|" in line}
    assert "vllm" not in imported
    assert not out.parent.exists()
    # In-process, the same line.
    assert main([*argv, "--batch-invariant", "--no-progress"]) == EXIT_JOB_FAILED
    assert "none is visible here" in one_error(capsys)
    assert invariance.ENV_VAR not in os.environ


@pytest.mark.parametrize(
    ("gpus", "version", "refused"),
    [
        ([H200], "0.26.0", None),
        ([H200, H200], "0.32.0", None),
        ([A100], "0.32.0", None),  # vLLM 0.32 added Ampere kernels
        ([A100], "0.26.0", "GPU 1 (compute capability 8.0) is not"),
        ([H200, T4], "0.32.0", "GPU 2 (compute capability 7.5) is not"),
        ([A100], None, "compute capability 9.0 or newer (vLLM ?)"),  # unknown: the stricter
        ([Gpu("3", 1)], "0.32.0", "GPU 3 (compute capability unknown) is not"),
        ([], "0.32.0", "none is visible here"),
    ],
)
def test_the_platform_check_follows_vllms_version(
    gpus: list[Gpu], version: str | None, refused: str | None
) -> None:
    if refused is None:
        invariance.check_platform(gpus, version)
        return
    with pytest.raises(ConfigError, match=r"^batch-invariant decoding") as caught:
        invariance.check_platform(gpus, version)
    assert refused in str(caught.value)


def test_the_mode_is_set_before_vllm_is_imported_or_refused(
    monkeypatch: pytest.MonkeyPatch, no_mode: None
) -> None:
    config = EngineConfig("m", batch_invariant=True)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    invariance.prepare_batch_invariance(config, gpus=[H200])
    assert os.environ[invariance.ENV_VAR] == "1"
    invariance.prepare_batch_invariance(config, gpus=[H200])  # again: nothing to do
    del os.environ[invariance.ENV_VAR]
    monkeypatch.setitem(sys.modules, "vllm", sys)  # vLLM imported without it: too late
    with pytest.raises(ConfigError, match="vLLM was imported in this process before"):
        invariance.prepare_batch_invariance(config, gpus=[H200])
    assert invariance.ENV_VAR not in os.environ
    invariance.prepare_batch_invariance(EngineConfig("m"), gpus=[])  # not asked: nothing


def test_the_mode_is_in_the_job_record_and_summary_and_a_resume_keeps_it(
    tmp_path: Path,
    samples: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_mode: None,
) -> None:
    """On a host that gives it (NVML's answer replaced by an H200's), the job runs with the
    variable set, says so, and records it; resuming without it is refused as another job."""
    monkeypatch.setattr(builder, "visible_gpus", lambda: [H200])
    monkeypatch.setattr(invariance, "vllm_version", lambda: "0.26.0")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    seen: list[str | None] = []

    def engine(*args: object) -> FakeEngine:
        seen.append(os.environ.get(invariance.ENV_VAR))
        return FakeEngine()

    monkeypatch.setattr(jobs, "_engine", engine)
    # The engine begun while the folder is listed: a fake one too (the job takes its own).
    monkeypatch.setattr(
        registry, "shared_engine_and_layout", lambda host, media, layout: (FakeEngine(), layout)
    )
    pictures = tmp_path / "in"
    pictures.mkdir()
    for name in ("sunset.jpg", "checkerboard.png"):
        (pictures / name).write_bytes((samples / name).read_bytes())
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(pictures), "--model", "m", "--out", str(out)]
    assert main([*argv, "--batch-invariant", "--no-progress"]) == EXIT_OK
    starts_ended()  # the fake engine begun while the folder was listed, done with
    assert seen == ["1"]
    assert "mmbatch: batch-invariant decoding (VLLM_BATCH_INVARIANT=1)" in capsys.readouterr().err
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summary["job"]["batch_invariant"] is True
    records = [p for p in tmp_path.iterdir() if p.name.startswith("o.jsonl") and "job" in p.name]
    assert any('"batch_invariant": true' in p.read_text() for p in records), records
    out.write_text(out.read_text().splitlines(keepends=True)[0])  # as if stopped half-way
    assert main([*argv, "--no-progress"]) == EXIT_JOB_FAILED
    message = one_error(capsys)
    assert "--batch-invariant" in message  # the setting that changed, in the user's words


def test_the_tests_leave_the_mode_off() -> None:
    assert os.environ.get(invariance.ENV_VAR) != "1"
