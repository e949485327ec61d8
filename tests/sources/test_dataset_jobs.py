"""``mmbatch caption`` over a local dataset into Parquet and a datasets folder, then
``mmbatch report`` on it in headless Chromium: the whole path a user takes, on the tiny model.

Run in-process with the session's engine settings, so the command reuses that engine.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

import datasets
import pytest
from browser import browse

from mmbatch.cli import EXIT_ITEMS_FAILED, main
from mmbatch.jobs import Job, run_in_memory
from mmbatch.output.formats import read_output
from mmbatch.output.paths import OutputPaths
from mmbatch.output.summary import read_summary
from mmbatch.types import MediaRef, Request, Sampling

pytestmark = pytest.mark.slow

NAMES = ["sunset.jpg", "checkerboard.png", "truncated.jpg", None, "arrow_exif_rotated.jpg"]
PROMPT = "Describe this image."
ENGINE_ARGS = [
    *("--engine-arg", "dtype=float32", "--engine-arg", "max_model_len=1024"),
    *("--engine-arg", "enforce_eager=true", "--engine-arg", "block_size=32"),
]


@pytest.fixture
def parquet_dataset(samples: Path, tmp_path: Path) -> Path:
    cells = [None if n is None else {"bytes": (samples / n).read_bytes(), "path": n} for n in NAMES]
    ds = datasets.Dataset.from_dict({"photo": cells, "name": [str(n) for n in NAMES]})
    path = tmp_path / "photos.parquet"
    ds.cast_column("photo", datasets.Image()).to_parquet(str(path))
    return path


def caption(model: Path, dataset: Path, out: Path, *extra: str) -> int:
    argv = ["caption", str(dataset), "--model", str(model), "--out", str(out)]
    argv += ["--max-tokens", "8", "--no-progress"]
    return main([*argv, "--prompt", PROMPT, *ENGINE_ARGS, *extra])


def test_a_parquet_dataset_to_parquet_and_datasets_then_the_gallery(
    vl_engine,  # type: ignore[no-untyped-def]
    tiny_vl_model: Path,
    parquet_dataset: Path,
    samples: Path,
    tmp_path: Path,
) -> None:
    good = [n for n in NAMES if n and n != "truncated.jpg"]
    requests = [Request(n, PROMPT, (MediaRef("image", str(samples / n)),)) for n in good]
    rows, _ = run_in_memory(Job(requests, Sampling(max_tokens=8)), vl_engine)
    reference = {row["id"]: row["text"] for row in rows}

    out = tmp_path / "captions.parquet"
    assert (
        caption(tiny_vl_model, parquet_dataset, out, "--image-column", "photo") == EXIT_ITEMS_FAILED
    )
    rows = {row["id"]: row for row in read_output(out)}
    assert sorted(rows) == ["0", "1", "2", "3", "4"]  # one row per dataset row, by index
    for index, name in enumerate(NAMES):
        row = rows[str(index)]
        if name in reference:
            assert row["error"] is None
            assert row["text"] == reference[name]  # the caption of that row's picture
            assert row["source"] == f"{parquet_dataset}#{index} ({name})"
    assert rows["2"]["error"]["stage"] == "decode"
    assert rows["3"]["error"] == {
        "stage": "source",
        "kind": "other",
        "message": f"{parquet_dataset}#3: no image (the cell is empty)",
    }
    summary = read_summary(OutputPaths(out))
    assert summary is not None
    assert summary["stats"]["total"] == 5
    assert summary["stats"]["ok"] == 3
    assert summary["stats"]["failed_by_stage"] == {"decode": 1, "source": 1}
    assert summary["stats"]["output_tokens_per_second"] > 0
    assert summary["job"]["dataset"]["image_column"] == "photo"

    folder = tmp_path / "captions"
    assert (
        caption(tiny_vl_model, parquet_dataset, folder, "--out-format", "datasets")
        == EXIT_ITEMS_FAILED
    )
    saved = datasets.load_from_disk(str(folder))
    assert {r["id"]: r["text"] for r in saved} == {i: r["text"] for i, r in rows.items()}
    assert json.loads((tmp_path / "captions.summary.json").read_text())["stats"]["total"] == 5

    page = tmp_path / "report.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    dom = browse(page, tmp_path / "profile", "--dump-dom")
    for text in reference.values():
        assert f'<p class="text">{escape(text, quote=False)}</p>' in dom
    # Thumbnails come from the dataset's rows (its cells hold bytes, not files).
    assert dom.count('src="data:image/jpeg;base64,') == 3
    assert "5: 3 ok, 2 failed (1 at decode, 1 at source)" in dom
