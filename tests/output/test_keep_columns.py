"""The input's other columns in the output rows: every one by default for a dataset (as
``Dataset.map`` and Ray Data LLM keep them), the named ones (or all) for a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import RECIPES

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
from mmbatch.errors import SourceError
from mmbatch.output.formats import read_output
from mmbatch.sources.local_datasets import DatasetInput, dataset_requests


@pytest.fixture
def manifest(tmp_path: Path, samples: Path) -> Path:
    rows = [
        {"path": str(samples / "sunset.jpg"), "id": "s", "label": "sky", "score": 0.9},
        {"path": str(samples / "checkerboard.png"), "id": "c", "text": "a board", "n": [1, 2]},
    ]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(argv: list[str]) -> int:
    return main([*argv, "--model", "m", "--no-progress"], FakeEngine())


def rows(out: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["id"]: r for r in read_output(out)}


def test_a_manifest_keeps_the_columns_named(manifest: Path, tmp_path: Path, samples: Path) -> None:
    out = tmp_path / "o.jsonl"
    root = ["--input-root", str(samples.parent)]
    assert run(["caption", str(manifest), "--out", str(out), *root]) == EXIT_OK
    assert "label" not in rows(out)["s"]  # none by default for a manifest
    named = tmp_path / "named.jsonl"
    keep = ["--keep-columns", "label,score"]
    assert run(["caption", str(manifest), "--out", str(named), *root, *keep]) == EXIT_OK
    got = rows(named)
    assert (got["s"]["label"], got["s"]["score"]) == ("sky", 0.9)
    assert (got["c"]["label"], got["c"]["score"]) == (None, None)  # absent in that row
    every = tmp_path / "all.jsonl"
    keep = ["--keep-columns", "all"]
    assert run(["caption", str(manifest), "--out", str(every), *root, *keep]) == EXIT_OK
    got = rows(every)
    assert got["c"]["n"] == [1, 2]
    # The manifest's own "text" column does not hide the caption: it is input_text.
    assert got["c"]["input_text"] == "a board"
    assert got["c"]["text"].endswith("|Describe this image in one sentence.")
    assert "path" not in got["c"]


def test_a_recipe_row_keeps_them_too(manifest: Path, tmp_path: Path, samples: Path) -> None:
    recipe = RECIPES / "multi_question.toml"
    out = tmp_path / "o.jsonl"
    argv = ["run", str(recipe), str(manifest), "--out", str(out)]
    argv += ["--input-root", str(samples.parent), "--keep-columns", "label"]
    assert run(argv) == EXIT_OK
    assert rows(out)["s"]["label"] == "sky"


@pytest.fixture
def dataset(tmp_path: Path, samples: Path) -> Path:
    names = ("sunset.jpg", "checkerboard.png")
    cells = [{"bytes": (samples / n).read_bytes(), "path": n} for n in names]
    ds = datasets.Dataset.from_dict(
        {
            "image": cells,
            "caption": ["old one", "old two"],
            "meta": [{"w": 1}, {"w": 2}],
            "thumb": [b"\x00", b"\x01"],
            "text": ["x", "y"],
        }
    ).cast_column("image", datasets.Image())
    path = tmp_path / "ds.parquet"
    ds.to_parquet(str(path))
    return path


def test_a_dataset_keeps_every_column_but_media_by_default(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.parquet"
    assert run(["caption", str(dataset), "--out", str(out)]) == EXIT_OK
    got = rows(out)
    assert (got["0"]["caption"], got["1"]["meta"]) == ("old one", {"w": 2})
    assert got["1"]["input_text"] == "y"
    assert "thumb" not in got["0"]  # bytes: no JSON row holds them
    none = tmp_path / "none.jsonl"
    assert run(["caption", str(dataset), "--out", str(none), "--keep-columns", "none"]) == EXIT_OK
    assert "caption" not in rows(none)["0"]


def test_a_column_that_is_not_there_or_cannot_be_kept_is_named(dataset: Path) -> None:
    spec = DatasetInput(str(dataset), "parquet")
    with pytest.raises(SourceError, match="no column 'nope' to keep; columns: image, caption"):
        dataset_requests(spec, "p", keep=("nope",))
    with pytest.raises(SourceError, match="'thumb' holds media or bytes"):
        dataset_requests(spec, "p", keep=("thumb",))


def test_keep_columns_is_checked_before_any_work(
    manifest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(manifest), "--out", str(out), "--keep-columns", "a,,b"]
    assert run(argv) == EXIT_JOB_FAILED
    assert "--keep-columns 'a,,b'" in capsys.readouterr().err
    assert not out.exists()
