"""The command line as a user meets it when they get it wrong: a flag only as spelled in
full, one line with the nearest flag, command or choice, and the ``--help`` of the command
the mistake was made in; ``run`` takes its inputs as ``caption`` does, after the recipe."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from repo_paths import RECIPES

from mmbatch.cli import EXIT_OK, build_parser, main


def mistake(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``mmbatch ARGV`` says on stderr, checked to be one line and exit code 2."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("mmbatch: error: ")
    return captured.err.rstrip("\n")


CAPTION = ["caption", "x.jpg", "--model", "m", "--out", "o.jsonl"]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("--max-token", "--max-tokens"), ("--no-progres", "--no-progress"), ("--temp", None)],
)
def test_an_abbreviated_flag_is_refused_with_the_flag_meant(
    typed: str, meant: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    said = mistake([*CAPTION, typed, "3"] if typed != "--no-progres" else [*CAPTION, typed], capsys)
    assert said.startswith(f"mmbatch: error: unrecognized arguments: {typed}")
    if meant is not None:
        assert f"did you mean {meant}?" in said
    assert said.endswith("(see mmbatch caption --help)")


def test_every_parser_takes_flags_only_in_full() -> None:
    parser = build_parser()
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parsers = [parser, *commands[0].choices.values()]
    assert len(parsers) > 8
    assert all(p.allow_abbrev is False for p in parsers)


def test_a_misspelt_command_gets_the_command_meant(capsys: pytest.CaptureFixture[str]) -> None:
    said = mistake(["captoin", "x.jpg"], capsys)
    assert "invalid choice: 'captoin'" in said
    assert "did you mean 'caption'?" in said
    assert said.endswith("(see mmbatch --help)")


def test_a_misspelt_choice_gets_the_choice_meant(capsys: pytest.CaptureFixture[str]) -> None:
    said = mistake([*CAPTION, "--out-format", "jsnl"], capsys)
    assert "did you mean 'jsonl'?" in said
    assert said.endswith("(see mmbatch caption --help)")


def test_unrecognized_arguments_point_at_the_commands_own_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    said = mistake(["run", "r.toml", "in.jpg", "--out", "o.jsonl", "--colour", "red"], capsys)
    assert said == "mmbatch: error: unrecognized arguments: --colour red (see mmbatch run --help)"


def test_run_takes_its_inputs_after_the_recipe(good_pictures: Path, tmp_path: Path) -> None:
    recipe = str(RECIPES / "multi_question.toml")
    out = tmp_path / "answers.jsonl"
    argv = ["run", recipe, str(good_pictures), "--model", "fake", "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    assert len(out.read_text().splitlines()) == 2


def test_run_still_understands_input_and_says_it_will_go(
    good_pictures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = str(RECIPES / "multi_question.toml")
    out = tmp_path / "answers.jsonl"
    argv = ["run", recipe, "--input", str(good_pictures), "--model", "fake", "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == sorted(
        str(p) for p in good_pictures.iterdir()
    )
    assert "--input is no longer needed" in capsys.readouterr().err


def test_run_without_inputs_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    said = mistake(["run", "r.toml", "--out", "o.jsonl"], capsys)
    assert said == (
        "mmbatch: error: the following arguments are required: INPUT (see mmbatch run --help)"
    )


@pytest.fixture
def good_pictures(tmp_path: Path, samples: Path) -> Path:
    import shutil

    folder = tmp_path / "pictures"
    folder.mkdir()
    for name in ("sunset.jpg", "checkerboard.png"):
        shutil.copyfile(samples / name, folder / name)
    return folder
