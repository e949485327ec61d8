"""The command line's argument handling, with real files and no engine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import RECIPES

from mmbatch.cli import EXIT_JOB_FAILED, build_parser, main
from mmbatch.engine.config import EngineConfig, parse_engine_args
from mmbatch.errors import ConfigError


def test_help_lists_the_commands() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mmbatch", "--help"], capture_output=True, text=True, check=True
    )
    assert "caption" in proc.stdout
    assert "make-tiny-model" in proc.stdout


def test_caption_requires_model_and_out(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["caption", "x.jpg"])
    assert info.value.code == 2
    assert "--model" in capsys.readouterr().err


def test_missing_input_fails_before_any_engine_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["caption", str(tmp_path / "nope"), "--model", "m", "--out", str(tmp_path / "o")])
    assert code == EXIT_JOB_FAILED
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_malformed_engine_arg_is_a_job_error(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["caption", str(samples), "--model", "m", "--out", str(tmp_path / "o")]
    assert main([*argv, "--engine-arg", "no_equals_sign"]) == EXIT_JOB_FAILED
    assert "is not KEY=VALUE" in capsys.readouterr().err


def test_more_gpus_than_the_host_has_is_a_job_error_before_any_output(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(samples / "sunset.jpg"), "--model", "m", "--out", str(out)]
    assert main([*argv, "--gpus", "999"]) == EXIT_JOB_FAILED
    assert re.search(r"--gpus 999: only \d+ GPU\(s\) are visible", capsys.readouterr().err)
    assert not out.exists()
    assert not (tmp_path / "o.jsonl.job.json").exists()


def test_engine_args_are_json_when_they_parse() -> None:
    parsed = parse_engine_args(
        [
            "max_model_len=2048",
            "enforce-eager=true",
            'limit_mm_per_prompt={"image": 2}',
            "dtype=float32",
        ]
    )
    assert parsed == {
        "max_model_len": 2048,
        "enforce_eager": True,
        "limit_mm_per_prompt": {"image": 2},
        "dtype": "float32",
    }


def test_engine_config_defaults_yield_to_the_user() -> None:
    kwargs = EngineConfig("m", {"tensor_parallel_size": 2}).llm_kwargs()
    assert kwargs["mm_encoder_tp_mode"] == "data"
    assert kwargs["disable_log_stats"] is False
    user = EngineConfig("m", {"tensor_parallel_size": 2, "mm_encoder_tp_mode": "weights"})
    assert user.llm_kwargs()["mm_encoder_tp_mode"] == "weights"
    assert "mm_encoder_tp_mode" not in EngineConfig("m").llm_kwargs()


def test_model_cannot_hide_in_engine_args() -> None:
    with pytest.raises(ConfigError, match=r"EngineConfig\.model"):
        EngineConfig("m", {"model": "other"})


def test_frames_needs_a_sampling(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frames", "v.mp4", "--model", "m", "--out", "o.jsonl"])
    assert info.value.code == 2
    assert "--fps" in capsys.readouterr().err


def test_bad_timestamps_are_a_job_error_before_any_engine(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["frames", str(samples / "clip.mp4"), "--timestamps", "1,x", "--model", "m"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == EXIT_JOB_FAILED
    assert "--timestamps '1,x': not numbers" in capsys.readouterr().err


def test_frames_help_imports_nothing_heavy() -> None:
    code = (
        "import contextlib, io, sys\nfrom mmbatch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['frames', '--help'])\n"
        "print(' '.join(m for m in ('av', 'PIL', 'torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_version_names_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    import mmbatch

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mmbatch {mmbatch.__version__}"


def test_check_shows_vllm_log_with_v(tiny_vl_model: Path) -> None:
    """In a process of its own: vLLM's logging is configured once per process. (Without
    ``-v`` its log goes to ``os.devnull`` through ``engine_log``, which sends a command's
    vLLM log to its file: the hub-name caption's test shows that quiet.)"""
    recipe = str(RECIPES / "short_caption.toml")
    argv = [sys.executable, "-m", "mmbatch", "check", recipe, "--model", str(tiny_vl_model)]
    shown = subprocess.run([*argv, "-v"], capture_output=True, text=True, check=True)
    assert "Resolved architecture" in shown.stdout + shown.stderr
    assert "can run it" in shown.stdout


def test_an_output_in_storage_names_vllms_log_by_the_url_it_is_uploaded_to(
    tiny_vl_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its local file is in a temporary mirror removed when the job ends: the line says
    where the log will be, beside the output."""
    from mmbatch.cli.options import engine_config_from
    from mmbatch.engine.builder import check_engine

    argv = ["caption", "x.jpg", "--model", str(tiny_vl_model), "--out", "s3://b/job/o.jsonl"]
    check_engine(engine_config_from(build_parser().parse_args(argv)), {"image": 1})
    assert capsys.readouterr().err.splitlines()[-1] == (
        "mmbatch: starting vLLM; its log goes to s3://b/job/o.jsonl.vllm.log (to see it here: -v)"
    )
