"""Every tiny family through ``mmbatch caption`` with the budget's counts: the families
``tests/tiny_models/test_families.py`` leaves to this tier (it runs two), and a clip on
Qwen2.5-VL (``tests/media/test_media_end_to_end.py`` runs clips on Qwen2-VL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from budgets import budget_for
from test_families import FAMILIES_HERE, NEW_FAMILIES, check_family_captions
from test_media_end_to_end import cli, read_rows

from mmbatch.media.options import scaled_size

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", [f for f in NEW_FAMILIES if f not in FAMILIES_HERE])
def test_family_captions_with_the_budgets_counts(
    family: str, samples: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    check_family_captions(family, samples, tmp_path_factory)


def test_a_clip_on_qwen2_5_vl_with_its_metadata(
    tmp_path_factory: pytest.TempPathFactory, samples: Path, tmp_path: Path
) -> None:
    # In a subprocess like the other CLI tests: a second in-process engine, once collected,
    # would tear down the distributed state the session's engines share.
    from mmbatch.tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2_5-vl"), family="qwen2_5_vl")
    out = tmp_path / "clip.jsonl"
    proc = cli(
        "caption", str(samples / "clip.mp4"), "--as-clip", "--num-frames", "8",
        "--model", str(model), "--out", str(out), "--prompt", "Describe.",
        "--engine-arg", "max_model_len=512", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = read_rows(out).values()
    budget = budget_for(model, 512)
    text = budget.text_tokens(None, "Describe.", ("video",))
    # Frames are decoded no larger than the video processor keeps them (its max_pixels).
    width, height = scaled_size(96, 64, budget.max_pixels("video"))
    assert (width, height) == (68, 45)
    assert row["prompt_tokens"] == text + budget.counts.video(width, height, 8).tokens
    assert row["output_tokens"] > 0
