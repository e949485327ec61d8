"""The whole fuzzing sweep, 5,400 cases (``tests/test_fuzz_inputs.py`` runs 1,040 of the
same kinds): manifests, CSV manifests, batch files, recipes and ``mmbatch check``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_inputs import (
    batch_lines,
    check_batch_file,
    check_command,
    check_csv_manifest,
    check_manifest,
    check_recipe,
    csv_bodies,
    drawn_from_the_strategies_alone,  # noqa: F401 (autouse: the same cases in any order)
    fuzz,
    input_folder,
    manifest_lines,
    recipes,
    toml_text,
)


@pytest.fixture
def folder(tmp_path: Path, samples: Path) -> Path:
    return input_folder(tmp_path, samples)


@fuzz(1500)
@given(lines=manifest_lines, allow_urls=st.booleans(), anywhere=st.booleans())
def test_any_manifest_ends_as_rows_or_one_error(
    folder: Path, lines: list[str], allow_urls: bool, anywhere: bool
) -> None:
    check_manifest(folder, lines, allow_urls, anywhere)


@fuzz(500)
@given(body=csv_bodies)
def test_any_csv_manifest_ends_as_rows_or_one_error(folder: Path, body: list[str]) -> None:
    check_csv_manifest(folder, body)


@fuzz(1500)
@given(lines=batch_lines, anywhere=st.booleans())
def test_any_batch_file_ends_as_lines_or_one_error(
    folder: Path, lines: list[str], anywhere: bool
) -> None:
    check_batch_file(folder, lines, anywhere)


@fuzz(1500)
@given(data=recipes)
def test_any_recipe_is_read_or_refused_in_the_commands_words(data: dict[str, Any]) -> None:
    check_recipe(data)


@fuzz(400)
@given(lines=toml_text)
def test_the_check_command_says_every_recipe_in_one_place(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], lines: list[str]
) -> None:
    check_command(tmp_path_factory, capsys, lines)
