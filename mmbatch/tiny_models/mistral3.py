"""A tiny random-weight Mistral 3 checkpoint (Pixtral vision, images) that vLLM loads.

Vision tower: Pixtral, 2 layers of width 64 (2 heads of 32) with 2D RoPE, 14-pixel patches
on pictures of up to 112 pixels a side, merged 2x2: up to 4x4 tokens, each row closed by
``[IMG_BREAK]`` and the last by ``[IMG_END]``. Text tower: the tiny one as a Mistral. Weights
are written as transformers names them (``model.vision_tower.*``,
``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head.*``), which vLLM's
Mistral 3 maps itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmbatch.tiny_models._common import (
    HALF_NORM,
    TINY_VISION,
    llama_text,
    prepare_dir,
    tiny_tokenizer,
    write_checkpoint,
    write_json,
)
from mmbatch.tiny_models.chat_templates import MISTRAL3_CHAT_TEMPLATE

if TYPE_CHECKING:
    from pathlib import Path

SPECIAL_TOKENS = {
    "<unk>": 0,
    "<s>": 1,
    "</s>": 2,
    "[INST]": 3,
    "[/INST]": 4,
    "[IMG]": 5,
    "[IMG_BREAK]": 6,
    "[IMG_END]": 7,
    "[SYSTEM_PROMPT]": 8,
    "[/SYSTEM_PROMPT]": 9,
}

PATCH = 14
LONGEST_EDGE = 112


def build_tiny_mistral3(out_dir: str | Path, seed: int) -> Path:
    """Write the tiny ``mistral3`` checkpoint (config, weights, tokenizer, processor)."""
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        PixtralImageProcessor,
        PixtralProcessor,
    )

    path = prepare_dir(out_dir)
    special = SPECIAL_TOKENS
    config = Mistral3Config(
        text_config=llama_text(
            model_type="mistral",
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            sliding_window=None,
            bos_token_id=special["<s>"],
            eos_token_id=special["</s>"],
        ),
        vision_config={
            **TINY_VISION,
            "head_dim": 32,
            "image_size": LONGEST_EDGE,
            "patch_size": PATCH,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        image_token_index=special["[IMG]"],
        spatial_merge_size=2,
        tie_word_embeddings=False,
    )
    config.architectures = ["Mistral3ForConditionalGeneration"]
    write_checkpoint(path, config, Mistral3ForConditionalGeneration, seed, {})
    write_json(path / "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2})

    tokenizer = tiny_tokenizer(
        special,
        MISTRAL3_CHAT_TEMPLATE,
        eos="</s>",
        pad="<unk>",
        bos="<s>",
    )
    image_processor = PixtralImageProcessor(
        size={"longest_edge": LONGEST_EDGE},
        patch_size=PATCH,
        image_mean=HALF_NORM,
        image_std=HALF_NORM,
    )
    processor = PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        spatial_merge_size=2,
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    return path
