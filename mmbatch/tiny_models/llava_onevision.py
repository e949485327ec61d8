"""A tiny random-weight LLaVA-OneVision checkpoint (images and video) that vLLM loads.

Vision tower: SigLIP, 2 layers of width 64, 56-pixel tiles of 14-pixel patches (16 patches a
tile). Images go through "anyres": the base tile plus up to 2x2 tiles (grid pinpoints up to
112x112) with a newline feature per row, at most 88 tokens. A video frame is one tile pooled
2x2: 4 tokens a frame, plus one newline token per video. Text tower: the tiny Qwen2.

Weights are written in the hub layout of ``llava-hf/llava-onevision-*``:
``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``image_newline``,
``language_model.model.*`` and ``language_model.lm_head.*``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmbatch.tiny_models._common import (
    HALF_NORM,
    TINY_VISION,
    prepare_dir,
    qwen2_text,
    tiny_tokenizer,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import chatml_template

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL_TOKENS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<image>": 3,
    "<video>": 4,
}
CHAT_TEMPLATE = chatml_template(image="<image>\n", video="<video>\n")

TILE = 56
GRID_PINPOINTS = [[TILE, TILE], [TILE, 2 * TILE], [2 * TILE, TILE], [2 * TILE, 2 * TILE]]
TINY_SIGLIP: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    **TINY_VISION,
    "image_size": TILE,
    "patch_size": 14,
}

_HUB_LAYOUT = {
    "model.vision_tower.": "vision_tower.vision_model.",
    "model.multi_modal_projector.": "multi_modal_projector.",
    "model.image_newline": "image_newline",
    "model.language_model.": "language_model.model.",
    "lm_head.": "language_model.lm_head.",
}


def build_tiny_llava_onevision(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``llava_onevision`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    path = prepare_dir(out_dir)
    special = SPECIAL_TOKENS
    config = LlavaOnevisionConfig(
        text_config=qwen2_text(special["<|endoftext|>"], special["<|im_end|>"], 0),
        vision_config=dict(TINY_SIGLIP),
        image_token_index=special["<image>"],
        video_token_index=special["<video>"],
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=GRID_PINPOINTS,
        tie_word_embeddings=False,
    )
    config.architectures = ["LlavaOnevisionForConditionalGeneration"]
    write_checkpoint(path, config, LlavaOnevisionForConditionalGeneration, seed, _HUB_LAYOUT)
    write_json(path / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [2, 0]})

    tokenizer = tiny_tokenizer(special, CHAT_TEMPLATE)
    tile = {"height": TILE, "width": TILE}
    image_processor = LlavaOnevisionImageProcessor(
        size=tile,
        crop_size=tile,
        image_grid_pinpoints=GRID_PINPOINTS,
        image_mean=HALF_NORM,
        image_std=HALF_NORM,
    )
    video_processor = LlavaOnevisionVideoProcessor(
        size=tile, image_mean=HALF_NORM, image_std=HALF_NORM
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        num_image_tokens=(TILE // 14) ** 2,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    return path
