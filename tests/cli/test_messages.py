"""Messages that point the right way: each names what the input is and what would work."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_cli import main
from fake_engine import FakeEngine
from repo_paths import RECIPES

from mmbatch.cli import EXIT_JOB_FAILED, EXIT_OK
from mmbatch.media.options import VideoOptions
from mmbatch.recipe import load_recipe
from mmbatch.recipe.requests import recipe_requests
from mmbatch.sources.timeline import frame_requests


def test_a_picture_given_to_the_video_recipe_says_the_recipe_reads_video(samples: Path) -> None:
    recipe = load_recipe(RECIPES / "video_clip_summary.toml")
    [jpeg, clip] = recipe_requests([str(samples / "sunset.jpg"), str(samples / "clip.mp4")], recipe)
    assert clip.error is None
    assert jpeg.error is not None
    message = jpeg.error.message
    assert message.startswith("an image file, but the recipe 'video-clip-summary'")
    assert "takes video only" in message
    assert "the model" not in message


def test_frames_of_a_still_image_say_it_is_not_a_video(samples: Path) -> None:
    [request] = frame_requests([str(samples / "sunset.jpg")], VideoOptions(), "p")
    assert request.error is not None
    assert request.error.kind == "unsupported"
    assert "a still image, not a video" in request.error.message
    assert "mmbatch caption" in request.error.message
    assert "damaged" not in request.error.message


def test_a_changed_prompt_is_the_only_change_reported(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(samples / "sunset.jpg"), "--model", "m", "--out", str(out)]
    assert main([*argv, "--no-progress"], FakeEngine()) == EXIT_OK
    capsys.readouterr()
    changed = [*argv, "--no-progress", "--prompt", "Another question."]
    assert main(changed, FakeEngine()) == EXIT_JOB_FAILED
    err = capsys.readouterr().err
    assert "(the prompt changed); " in err
    for same in ("video_options", "image_options", "audio_options", "sampling", "decode option"):
        assert same not in err, err


def test_a_dataset_row_is_never_named_by_its_place_in_the_batch() -> None:
    import datasets

    from mmbatch import DatasetMap

    ds = datasets.Dataset.from_dict({"image": [None, None, None]})
    fn = DatasetMap("unused-model", "Describe.")
    plain = ds.map(fn, batched=True, batch_size=1)
    assert plain["error"][2] == "source: this row: no image (the cell is empty)"
    indexed = ds.map(fn, batched=True, batch_size=1, with_indices=True)
    assert indexed["error"][2] == "source: row 2: no image (the cell is empty)"
    assert list(indexed["text"]) == ["", "", ""]
