"""The pre-flight token budget, with the tiny models' real processors and vLLM's own token
counts for them (its processing info, no engine).

The slow tests check the same counts against the prompt lengths vLLM reports; here the
counts, the shrinking and the error messages are checked where they are cheap.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from budgets import budget_for

from mmbatch.engine.budget import ItemCount, PromptBudget
from mmbatch.errors import RequestRejected
from mmbatch.media.options import VideoOptions
from mmbatch.media.video import index_video, select_frames
from mmbatch.types import MediaItem, MediaRef, Request


@pytest.fixture(scope="module")
def vl_budget(tiny_vl_model: Path) -> PromptBudget:
    return budget_for(tiny_vl_model, 1024)


def test_counts_match_the_counts_seen_on_vllm(vl_budget: PromptBudget) -> None:
    counts = vl_budget.counts
    assert counts is not None

    def video(width: int, height: int, frames: int) -> int | None:
        item = counts.video(width, height, frames)
        return None if item is None else item.tokens

    # Seen on vLLM with the tiny Qwen2-VL: 4/8/16 frames of 112x112 -> 8/16/32 tokens.
    assert [video(112, 112, n) for n in (4, 8, 16)] == [8, 16, 32]
    assert video(112, 112, 3) == video(112, 112, 4)  # padded to a whole temporal patch
    # Images are scaled into [784, 6272] pixels of 28-pixel cells, 4 patches a token; on
    # Qwen the count is the prompt's tokens and the encoder's outputs alike.
    assert counts.image(112, 112) == ItemCount(4, 4)  # scaled down to 56x56
    assert counts.image(56, 112) == ItemCount(8, 8)
    assert counts.image(20, 20) == ItemCount(1, 1)  # scaled up to 28x28
    # The processor's own caps: pictures and frames are decoded no larger.
    assert (vl_budget.max_pixels("image"), vl_budget.max_pixels("video")) == (6272, 3136)
    assert vl_budget.audio_rate is None


def test_counts_follow_the_real_qwen2_vl_7b_config(tmp_path: Path) -> None:
    from mmbatch.tiny_models import write_real_shape

    budget = budget_for(write_real_shape(tmp_path / "q7", "qwen2_vl_7b"), 32768)
    assert budget.counts is not None
    assert budget.counts.image(1280, 720) == ItemCount(46 * 26, 46 * 26)
    assert budget.max_pixels("image") == 16384 * 28 * 28


def test_the_engines_processor_settings_change_the_counts(tiny_vl_model: Path) -> None:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.processor import ChatTemplate
    from mmbatch.engine.vllm_settings import processing_counts

    # vLLM hands mm_processor_kwargs to the model's processor: capped at 4 cells, the
    # 56x112 picture (8 tokens by the processor's own cap) is resized to 28x56, 2 tokens,
    # and the budget counts what vLLM will make of it.
    template = ChatTemplate(str(tiny_vl_model), trust_remote_code=False)
    size = {"longest_edge": 4 * 28 * 28, "shortest_edge": 28 * 28}
    settings = {"mm_processor_kwargs": {"size": size}}
    counts = processing_counts(EngineConfig(str(tiny_vl_model), settings), template.render)
    assert counts.image(56, 112) == ItemCount(2, 2)


def test_a_text_only_model_has_no_media_to_count(tmp_path: Path) -> None:
    from mmbatch.engine.config import EngineConfig
    from mmbatch.engine.vllm_settings import processing_counts
    from mmbatch.tiny_models._common import qwen2_text, write_json
    from mmbatch.tiny_models.chat_templates import QWEN_CHAT_TEMPLATE
    from mmbatch.tiny_models.tokenizer import (
        TINY_SPECIAL_TOKENS,
        build_tokenizer,
        wrap_tokenizer,
    )

    # A plain Qwen2 language model (an OpenAI batch of text lines): config and tokenizer.
    write_json(
        tmp_path / "config.json",
        {**qwen2_text(0, 2, 0), "architectures": ["Qwen2ForCausalLM"]},
    )
    tokenizer = build_tokenizer(1024, TINY_SPECIAL_TOKENS)
    wrap_tokenizer(
        tokenizer, chat_template=QWEN_CHAT_TEMPLATE, model_max_length=4096
    ).save_pretrained(str(tmp_path))
    counts = processing_counts(EngineConfig(str(tmp_path)), lambda *parts: "")
    assert counts.modalities == frozenset()
    assert (counts.image(64, 64), counts.video(64, 64, 4), counts.audio(16000)) == (None,) * 3


def test_audio_counts_are_25_tokens_a_second(tiny_audio_model: Path) -> None:
    budget = budget_for(tiny_audio_model, 1024)
    assert budget.audio_rate == 16000
    assert budget.counts is not None
    assert budget.counts.image(64, 64) is None
    assert budget.counts.audio(16000) == ItemCount(25, 25)
    assert budget.counts.audio(16000 * 30) == ItemCount(750, 750)
    assert budget.counts.audio(16000 * 60) == ItemCount(750, 750)  # the extractor keeps 30 s


def test_text_tokens_leave_out_the_media_placeholders(vl_budget: PromptBudget) -> None:
    plain = vl_budget.text_tokens(None, "Describe.", ())
    with_image = vl_budget.text_tokens(None, "Describe.", ("image",))
    # <|vision_start|> and <|vision_end|> count; the one <|image_pad|> is the image's.
    assert with_image == plain + 2


def image_item(width: int, height: int) -> MediaItem:
    return MediaItem("image", "k", None, {"width": width, "height": height})


def test_an_over_long_prompt_is_refused_saying_by_how_much(tiny_vl_model: Path) -> None:
    request = Request("r", "Describe.", (MediaRef("image", "x.jpg"),))
    text = budget_for(tiny_vl_model, 1024).text_tokens(None, "Describe.", ("image",))
    budget = budget_for(tiny_vl_model, max_model_len=text + 1 + 4)
    budget.check(request, [image_item(112, 112)])  # 4 image tokens: just fits
    with pytest.raises(RequestRejected) as info:
        budget.check(request, [image_item(56, 112)])  # 8 image tokens
    assert str(info.value) == (
        f"the prompt takes {text + 8} tokens (text {text} + image 8), 4 over "
        f"max_model_len {text + 5} (less 1 token for the answer)"
    )


def test_an_item_over_the_encoder_cache_is_refused(tiny_vl_model: Path) -> None:
    budget = budget_for(tiny_vl_model, max_model_len=1024, max_item_tokens=6)
    with pytest.raises(RequestRejected, match="the image takes 8 tokens, 2 over"):
        budget.check(Request("r", "p", (MediaRef("image", "x"),)), [image_item(56, 112)])


def test_a_clip_too_long_is_shrunk_within_the_bounds_allowed(
    tiny_vl_model: Path, samples: Path
) -> None:
    index = index_video(str(samples / "clip.mp4"))  # 96x64: 2 tokens per 2 frames
    request = Request("c", "Describe.", (MediaRef("video", "clip.mp4"),))
    text = budget_for(tiny_vl_model, 1024).text_tokens(None, "Describe.", ("video",))
    budget = budget_for(tiny_vl_model, max_model_len=text + 1 + 2 * 8)  # room for 16 frames
    options = VideoOptions(sampling="fps", fps=25, max_frames=40)
    # Not allowed to shrink: refused, with the numbers and how to allow it.
    with pytest.raises(RequestRejected, match=r"over max_model_len .*allow shrinking"):
        budget.fit_clip(request, index, options)
    shrunk = budget.fit_clip(request, index, VideoOptions(**{**options.__dict__, "min_frames": 4}))
    assert len(select_frames(index, shrunk)) == 16
    assert shrunk.max_pixels is None
    # Fewer frames are not enough when even the floor is over: pixels go next.
    tight = budget_for(tiny_vl_model, max_model_len=text + 1 + 4)
    allowed = VideoOptions(sampling="fps", fps=25, min_frames=8, min_pixels=28 * 28)
    fitted = tight.fit_clip(request, index, allowed)
    assert len(select_frames(index, fitted)) == 8
    assert fitted.max_pixels is not None
    assert fitted.max_pixels < 96 * 64
    with pytest.raises(RequestRejected, match="even the fewest"):
        budget_for(tiny_vl_model, max_model_len=text).fit_clip(request, index, allowed)


@pytest.mark.parametrize(("width", "height"), [(1, 201), (1, 5000), (5000, 1)])
def test_an_extreme_aspect_ratio_is_the_items_refusal_not_a_crash(
    vl_budget: PromptBudget, width: int, height: int
) -> None:
    request = Request("strip", "Describe.", (MediaRef("image", "strip.png"),))
    with pytest.raises(RequestRejected, match="aspect ratio must be smaller than 200") as info:
        vl_budget.check(request, [image_item(width, height)])
    assert (info.value.stage, info.value.kind) == ("validate", "rejected")
    assert f"{width}x{height} pixels" in str(info.value)
    vl_budget.check(request, [image_item(1, 199)])  # under the processor's ratio: measured


def test_a_clip_of_extreme_aspect_ratio_is_refused_before_decoding(
    vl_budget: PromptBudget, tmp_path: Path
) -> None:
    from media_files import cfr_video

    strip = cfr_video(tmp_path / "strip.mp4", frames=4, size=(16, 3600))
    request = Request("c", "Describe.", (MediaRef("video", str(strip)),))
    with pytest.raises(RequestRejected, match=r"16x3600 pixels.*aspect ratio"):
        vl_budget.fit_clip(request, index_video(str(strip)), VideoOptions())


def test_whatever_measuring_raises_is_the_items_refusal(vl_budget: PromptBudget) -> None:
    broken = MediaItem("image", "k", None, {"width": "wide", "height": 10})
    with pytest.raises(RequestRejected, match="cannot measure the prompt: ValueError"):
        vl_budget.check(Request("r", "p", (MediaRef("image", "x"),)), [broken])


def test_a_job_with_extreme_strips_gives_their_rows_and_goes_on(
    vl_budget: PromptBudget, samples: Path, tmp_path: Path
) -> None:
    import json

    from fake_cli import main
    from fake_engine import FakeEngine
    from PIL import Image

    from mmbatch.cli import EXIT_ITEMS_FAILED

    class MeasuredFake(FakeEngine):
        def prompt_limits(self) -> PromptBudget:  # type: ignore[override]
            return vl_budget

    folder = tmp_path / "in"
    folder.mkdir()
    for width, height in ((1, 201), (1, 5000), (40, 30)):
        Image.new("RGB", (width, height), (9, 90, 200)).save(folder / f"{width}x{height}.png")
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(folder), "--model", "fake", "--out", str(out), "--no-progress"]
    for _ in range(2):  # and a rerun does not die on them either
        assert main(argv, MeasuredFake()) == EXIT_ITEMS_FAILED
    rows = {Path(r["id"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["40x30.png"]["error"] is None
    for name in ("1x201.png", "1x5000.png"):
        assert rows[name]["error"]["stage"] == "validate"
        assert "aspect ratio" in rows[name]["error"]["message"]
