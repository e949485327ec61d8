"""The columns of mmbatch's rows are declared once (``mmbatch.row_schema.COLUMNS``); what
writes rows writes those columns, and what reads them asks there."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from media_files import cfr_video, truncated

from mmbatch.errors import ConfigError
from mmbatch.integrations.dataset_runs import run_dataset
from mmbatch.integrations.hf_datasets import DatasetMap
from mmbatch.media.options import VideoOptions
from mmbatch.output.rows import FLAT, MEDIA_ONLY, ItemRows, output_row
from mmbatch.review.gallery import KNOWN_FIELDS
from mmbatch.row_schema import COLUMN_NAMES, FLAT_COLUMNS, TOKEN_COLUMNS
from mmbatch.sources.files import SourcePolicy
from mmbatch.sources.timeline import frame_requests
from mmbatch.types import MediaRef, Request, Result, Usage


def test_a_flat_row_writes_the_declared_columns_in_their_order() -> None:
    request = Request("a", "Describe.", (MediaRef("image", "a.jpg"),))
    row = output_row(request, ("k",), Result("a", text="t", usage=Usage(3, 2, 1)))
    assert list(row) == [column.name for column in FLAT_COLUMNS]
    assert FLAT.outcome(row).usage == Usage(3, 2, 1)  # read back by the same names


def test_recipe_and_media_rows_write_only_declared_columns() -> None:
    asked = [
        Request(f"i:{name}", name, (MediaRef("image", "a.jpg"),), item_id="i", output=name)
        for name in ("caption", "tags")
    ]
    items = ItemRows(asked, parse=json.loads)
    assert items.add(asked[0], ("k",), Result("i:caption", text='"x"')) is None
    row = items.add(asked[1], ("k",), Result("i:tags", text="[1]"))
    assert row is not None
    assert row.data.keys() <= COLUMN_NAMES
    for answer in row.data["outputs"].values():
        assert answer.keys() <= COLUMN_NAMES
    media = MEDIA_ONLY.add(asked[0], ("k",), Result("i:caption"))
    assert media.data.keys() <= COLUMN_NAMES
    # The gallery shows the answer's own fields in a card and lists the rest under "more".
    assert {"id", "text", "error", "outputs", "prompt_tokens"} <= KNOWN_FIELDS
    assert not {"video", "frame_index", "pts", "frame_path", "warning"} & KNOWN_FIELDS


def test_an_input_column_named_like_a_row_column_is_kept_beside_it(tmp_path: Path) -> None:
    """A frame of a truncated video says so in ``warning``; a manifest's own ``warning``
    column is kept as ``input_warning``, never as a second ``warning`` that would hide one
    of the two."""
    whole = cfr_video(tmp_path / "whole.mp4", frames=125, faststart=True)
    truncated(whole, tmp_path / "cut.mp4")
    manifest = tmp_path / "videos.jsonl"
    manifest.write_text(json.dumps({"path": "cut.mp4", "warning": "mine", "pts": 7}) + "\n")
    policy = SourcePolicy(keep_columns="all")
    options = VideoOptions(num_frames=2)
    requests = frame_requests([str(manifest)], options, "Describe.", policy=policy)
    assert len(requests) == 2
    for request in requests:
        names = [name for name, _ in request.columns]
        assert len(names) == len(set(names)), names
        columns = dict(request.columns)
        assert str(columns["warning"]).startswith("truncated video:")
        assert columns["input_warning"] == "mine"
        assert columns["input_pts"] == 7
        assert {n for n in names if not n.startswith("input_")} <= COLUMN_NAMES


@pytest.mark.parametrize("name", TOKEN_COLUMNS)
def test_a_dataset_task_with_usage_never_overwrites_a_token_column(
    name: str, tmp_path: Path
) -> None:
    """``DatasetMap(with_usage=True)`` writes the token columns by the row schema's names, so
    a dataset already holding one of them is refused before anything runs."""
    ds = datasets.Dataset.from_dict({"image": ["a.jpg"], name: [0]})
    task = DatasetMap("fake", "Describe.", with_usage=True)
    with pytest.raises(ConfigError, match=f"already has a column '{name}'"):
        run_dataset(ds, task, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
