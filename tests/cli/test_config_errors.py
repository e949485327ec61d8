"""Configuration mistakes: exit code 2, one line naming the bad value and what would be
valid, and nothing written. Checked against vLLM's own reading of the settings (no engine
is started) and the tiny model's real config; ``mmbatch check`` catches the same mistakes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from error_line import one_error
from repo_paths import RECIPES

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK, main


def caption(samples: Path, out: Path, *extra: str) -> int:
    """The exit code, whether the command returned it or argparse exited with it."""
    try:
        return main(["caption", str(samples / "sunset.jpg"), "--out", str(out), *extra])
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("name", ["c.csv", "c.tsv", "c.json"])
def test_an_output_named_for_a_format_not_written_is_refused(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """``--out c.csv`` once wrote JSON lines under the name of a CSV file."""
    from fake_cli import main as fake_main

    out = tmp_path / "out" / name
    assert caption(samples, out, "--model", "m") == EXIT_JOB_FAILED
    message = one_error(capsys)
    assert message.startswith(f"--out {out}: mmbatch does not write ")
    assert "name the output c.jsonl (JSON lines) or c.parquet" in message
    assert not (tmp_path / "out").exists()
    # Asked for by name, JSON lines it is.
    argv = ["caption", str(samples / "sunset.jpg"), "--model", "m", "--out", str(out)]
    assert fake_main([*argv, "--out-format", "jsonl", "--no-progress"]) == EXIT_OK
    assert json.loads(out.read_text().splitlines()[0])["error"] is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens 0: must be an integer >= 1"),
        (["--temperature", "-1"], "--temperature -1.0: must be a number >= 0"),
        (["--top-p", "2"], "--top-p 2.0: must be in (0, 1]"),
        (["--temperature", "inf"], "--temperature inf: must be a number >= 0, and finite"),
        (["--repetition-penalty", "nan"], "--repetition-penalty nan: must be a number > 0"),
        (["--n", "0"], "--n 0: must be an integer >= 1"),
        (["--max-tokens", "abc"], "argument --max-tokens: invalid int value: 'abc'"),
        (["--engine-arg", "oops"], "engine argument 'oops' is not KEY=VALUE"),
    ],
)
def test_bad_flags_are_one_line_and_write_nothing(
    samples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    out = tmp_path / "out" / "c.jsonl"
    assert caption(samples, out, "--model", "m", *flags) == EXIT_JOB_FAILED
    assert message in one_error(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--engine-arg", "max_model_length=4096"],
            "engine argument 'max_model_length': vLLM has no such argument "
            "(did you mean 'max_model_len'?)",
        ),
        (
            ["--engine-arg", "max_model_len=abc"],
            "engine argument max_model_len='abc': Input should be a valid integer",
        ),
        (
            ["--engine-arg", "dtype=floaty"],
            "engine argument dtype='floaty': Input should be 'auto', 'half', 'float16'",
        ),
        (
            ["--engine-arg", "max_model_len=99999"],
            "max_model_len 99999 is longer than the context of the model",
        ),
    ],
)
def test_engine_settings_vllm_refuses_are_one_line_before_anything_is_written(
    samples: Path,
    tmp_path: Path,
    tiny_vl_model: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    out = tmp_path / "out" / "c.jsonl"
    assert caption(samples, out, "--model", str(tiny_vl_model), *flags) == EXIT_JOB_FAILED
    assert message in one_error(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("/no/such/model", "model '/no/such/model': no such model folder"),
        (
            "nope/no-such-model",
            "model 'nope/no-such-model' is not a local folder nor in the Hugging "
            "Face cache, and HF_HUB_OFFLINE is set, so the hub was not asked",
        ),
    ],
)
def test_a_model_that_is_not_there_is_one_line(
    samples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    message: str,
) -> None:
    import huggingface_hub.constants

    # No network here: answer at once, not after the hub's retries. The library reads the
    # variable once, when first imported (an earlier test may have imported it).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "out" / "c.jsonl"
    assert caption(samples, out, "--model", model) == EXIT_JOB_FAILED
    assert message in one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_hub_that_cannot_be_reached_is_said_in_our_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What transformers raises when the hub cannot be reached, said without the hub
    library's advice about arguments the user never wrote."""
    import huggingface_hub.constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.vllm_settings import _config_problem

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    cause = LocalEntryNotFoundError("Connection refused; pass 'local_files_only=False'")
    exc = OSError("We couldn't connect to 'https://huggingface.co' to load the files")
    exc.__cause__ = cause
    assert _config_problem(EngineConfig("org/model"), exc) == (
        "model 'org/model' is not a local folder nor in the Hugging Face cache, and the "
        "Hugging Face hub cannot be reached"
    )


MISSING_MODEL_FACES = """
import json, sys
from mmbatch.cli import main
from mmbatch.errors import ConfigError
samples, missing, out = sys.argv[1:4]
said = []
for inputs in (["sunset.jpg"], ["clip.mp4", "--as-clip"]):
    argv = ["caption", f"{samples}/{inputs[0]}", *inputs[1:], "--model", missing, "--out", out]
    said.append(main(argv))
import mmbatch
for face in (
    lambda: mmbatch.caption(f"{samples}/sunset.jpg", model=missing),
    lambda: mmbatch.DatasetMap(missing, "p", allowed_paths=[samples])(
        {"image": [f"{samples}/sunset.jpg"]}
    ),
):
    try:
        face()
    except ConfigError as exc:
        said.append(str(exc))
print(json.dumps({"said": said, "vllm": "vllm" in sys.modules}))
"""


def test_a_missing_model_folder_is_said_before_vllm_is_imported(
    samples: Path, tmp_path: Path
) -> None:
    """It took 21 s and more to say, the time it takes to import vLLM: the command, a
    notebook's ``caption`` and a ``DatasetMap`` now say it at once."""
    import subprocess
    import sys

    missing, out = tmp_path / "no-model", tmp_path / "out" / "c.jsonl"
    probe = [sys.executable, "-c", MISSING_MODEL_FACES, str(samples), str(missing), str(out)]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["vllm"] is False, done.stderr[-2000:]
    said = f"model {str(missing)!r}: no such model folder"
    assert result["said"][:2] == [EXIT_JOB_FAILED, EXIT_JOB_FAILED]
    assert [message.startswith(said) for message in result["said"][2:]] == [True, True]
    assert done.stderr.count(f"mmbatch: error: {said}") == 2
    assert not out.parent.exists()


INPUT_MISTAKES_OF_RUN = """
import json, sys
from mmbatch.cli import main
recipe, model, out, *inputs = sys.argv[1:]
codes = [main(["run", recipe, given, "--model", model, "--out", out]) for given in inputs]
print(json.dumps({"codes": codes, "vllm": "vllm" in sys.modules}))
"""


def test_a_mistake_in_runs_inputs_is_said_before_vllm_is_imported(
    tmp_path: Path, tiny_vl_model: Path
) -> None:
    """A missing input, a folder of nothing to run and a manifest that cannot be read are
    said as ``caption`` says them, before the recipe is fitted to the model (which imports
    vLLM, seconds); a real model, which the fit would read."""
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    (tmp_path / "rows.jsonl").write_text('{"file": "a.jpg"}\n')
    body = '[prompt]\ntext = "Describe."\n'
    inputs = [str(tmp_path / name) for name in ("missing", "empty", "rows.jsonl")]
    out = tmp_path / "out" / "r.jsonl"
    argv = [str(recipe(tmp_path, body)), str(tiny_vl_model), str(out), *inputs]
    probe = [sys.executable, "-c", INPUT_MISTAKES_OF_RUN, *argv]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "codes": [EXIT_JOB_FAILED] * 3,
        "vllm": False,
    }, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"mmbatch: error: input {inputs[0]!r} does not exist",
        f"mmbatch: error: no images found in {inputs[1]!r}",
        f"mmbatch: error: {inputs[2]}:1: row has no 'path' (got {{'file': 'a.jpg'}})",
    ]
    assert not out.parent.exists()


def recipe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(textwrap.dedent(body))
    return path


def test_a_recipe_engine_typo_and_a_too_small_model_fail_run_before_any_output(
    samples: Path, tmp_path: Path, tiny_vl_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = recipe(tmp_path, '[prompt]\ntext = "x"\n[engine]\nmax_model_length = 4096\n')
    out = tmp_path / "out" / "a.jsonl"
    argv = [str(samples / "sunset.jpg"), "--model", str(tiny_vl_model)]
    assert main(["run", str(typo), *argv, "--out", str(out)]) == EXIT_JOB_FAILED
    assert "did you mean 'max_model_len'?" in one_error(capsys)
    # A clip recipe whose answers alone outgrow the tiny model's 4096-token context.
    long = recipe(
        tmp_path,
        """
        name = "long-clips"
        [prompt]
        text = "Summarise."
        [sampling]
        max_tokens = 5000
        [media]
        kind = "video"
        as_clip = true
        """,
    )
    clip = [str(samples / "clip.mp4"), "--model", str(tiny_vl_model)]
    assert main(["run", str(long), *clip, "--out", str(out)]) == EXIT_JOB_FAILED
    error = one_error(capsys)
    assert "holds 4096 tokens of context; the recipe 'long-clips' needs" in error
    assert "answer 5000" in error
    assert not (tmp_path / "out").exists()


def test_check_finds_an_engine_typo_and_a_missing_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = recipe(tmp_path, '[prompt]\ntext = "x"\n[engine]\nmax_model_length = 4096\n')
    assert main(["check", str(typo)]) == EXIT_JOB_FAILED
    assert "did you mean 'max_model_len'?" in one_error(capsys)
    missing = tmp_path / "m.toml"
    missing.write_text('[prompt]\ntext = "x"\n[engine]\nmodel = "/no/such/model"\n')
    assert main(["check", str(missing)]) == EXIT_JOB_FAILED
    assert "no such model folder" in one_error(capsys)


def test_check_says_whether_a_model_can_run_each_recipe(
    tiny_vl_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny VL model (4096 tokens of context, no audio) against the bundled recipes:
    read from its config and processor, no engine started."""
    names = ["short_caption", "video_clip_summary", "video_frame_captions", "audio_transcription"]
    paths = [str(RECIPES / f"{name}.toml") for name in names]
    assert main(["check", *paths, "--model", str(tiny_vl_model)]) == EXIT_JOB_FAILED
    captured = capsys.readouterr()
    verdicts = [line for line in captured.out.splitlines() if line.startswith("  ")]
    assert len(verdicts) == 3
    for verdict in verdicts:
        assert f"{tiny_vl_model} can run it: max_model_len 256: the recipe needs" in verdict
        assert "the model holds 4096" in verdict
    assert "a clip of 8 frames of up to 3136 pixels" in captured.out
    assert "takes no audio input" in captured.err
    assert "INFO" not in captured.out + captured.err  # vLLM's log, left out without -v


def test_check_without_a_model_here_says_it_did_not_check_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No network here, and no Qwen in the cache: the recipe's hub model cannot be read.
    assert main(["check", str(RECIPES / "short_caption.toml")]) == EXIT_OK
    out = capsys.readouterr().out
    assert "short_caption.toml: ok" in out
    assert "model Qwen/Qwen2.5-VL-3B-Instruct: not checked (not on this machine" in out


def test_an_engine_config_refuses_a_negative_number_of_render_threads() -> None:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.errors import ConfigError

    with pytest.raises(ConfigError, match="render_threads must be >= 0, got -1"):
        EngineConfig("m", render_threads=-1)
    assert EngineConfig("m", render_threads=0).render_threads == 0  # render on the loop
