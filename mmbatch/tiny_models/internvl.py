"""A tiny random-weight InternVL (the transformers format of InternVL3) that vLLM loads.

Vision tower: InternViT, 2 layers of width 64, 56-pixel tiles of 14-pixel patches, pixel
shuffle 0.5: 4 tokens a tile. A picture is cut into 1 to 4 tiles by its aspect ratio, plus a
thumbnail tile when there are several; vLLM writes them as ``<img>`` + 4 tokens a tile +
``</img>``. A video's frames are one tile each (``Frame1: <img>...</img>``, ...). Text tower:
the tiny Qwen2. vLLM serves this format with its InternS1 model, which reads the transformers
layout of the weights (``model.vision_tower.*``, ``model.language_model.*``, ``lm_head.*``),
so they are written as transformers names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmbatch.tiny_models._common import (
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
    "<img>": 3,
    "</img>": 4,
    "<IMG_CONTEXT>": 5,
    "<video>": 6,
}
NAMED_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
CHAT_TEMPLATE = chatml_template(image="<IMG_CONTEXT>\n", video="<video>\n")

TILE = 56
TOKENS_PER_TILE = 4  # (56 / 14) ** 2 patches, pixel-shuffled by 0.5 a side
MAX_TILES = 4


def build_tiny_internvl(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``internvl`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    path = prepare_dir(out_dir)
    special = SPECIAL_TOKENS
    config = InternVLConfig(
        text_config=qwen2_text(special["<|endoftext|>"], special["<|im_end|>"], 0),
        vision_config={
            **TINY_VISION,
            "image_size": [TILE, TILE],
            "patch_size": [14, 14],
        },
        image_token_id=special["<IMG_CONTEXT>"],
        image_seq_length=TOKENS_PER_TILE,
        downsample_ratio=0.5,
        tie_word_embeddings=False,
    )
    config.architectures = ["InternVLForConditionalGeneration"]
    write_checkpoint(path, config, InternVLForConditionalGeneration, seed, {})
    write_json(path / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [2, 0]})

    tokenizer = tiny_tokenizer(
        special,
        CHAT_TEMPLATE,
        named=NAMED_TOKENS,
    )
    tile = {"height": TILE, "width": TILE}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(
            size=tile, crop_to_patches=True, min_patches=1, max_patches=MAX_TILES
        ),
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size=tile),
        image_seq_length=TOKENS_PER_TILE,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    return path
